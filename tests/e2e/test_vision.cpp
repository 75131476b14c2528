// Image input through the real binary (tests/decks/vision: the tiny preset's vision tower, three
// requests with PNG/JPEG images batched with two text-only ones, 16-token prefill chunks that cut
// the placeholder runs):
//   - every request's greedy tokens equal a by-hand run of the same seeded model: its images
//     decoded and encoded alone (model::vision_forward), spliced over its placeholder rows of one
//     whole-prompt forward (model::MediaSplice), then decoded token by token; logprobs ≤ 1e-4;
//   - profile.h5 holds /vision/* with the images and tokens of the workload;
//   - tp2 and pp2 runs (the tower replicated on the first stage's ranks) and a run that preempts
//     image requests equal the one-rank run;
//   - an unreadable image, an oversized one and a placeholder count that does not match its
//     images exit 3 naming the request and the file; with on_bad_request: skip the job finishes
//     the other requests; images.pool 2 cuts the image tokens by 4 (the placeholders then differ).
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "hymoe/io/h5.h"
#include "hymoe/io/image.h"
#include "hymoe/io/requests.h"
#include "hymoe/io/safetensors.h"
#include "hymoe/model/model.h"
#include "run_binary.h"

namespace fs = std::filesystem;
using namespace hymoe;
using hymoe::testing::run_hymoe;

namespace {

const std::string kDir = "tests/decks/vision/";
const std::string kDeck = kDir + "deck.yaml";
constexpr uint64_t kSeed = 11;  // the deck's job.seed
constexpr int kMaxNew = 8;      // the deck's max_new_tokens

struct Output {
    std::vector<int64_t> tokens;
    std::vector<float> logprobs;
};

// results.h5 by request id
std::map<std::string, Output> read_results(const std::string& path) {
    io::H5Reader h5(path);
    const std::vector<std::string> ids = h5.strings("/requests/id");
    const std::vector<int64_t> off = h5.ints("/requests/output_offsets");
    const std::vector<int64_t> tok = h5.ints("/requests/output_tokens");
    const std::vector<float> lp = h5.floats("/requests/output_logprobs");
    std::map<std::string, Output> out;
    for (size_t i = 0; i < ids.size(); ++i) {
        Output& o = out[ids[i]];
        o.tokens.assign(tok.begin() + off[i], tok.begin() + off[i + 1]);
        o.logprobs.assign(lp.begin() + off[i], lp.begin() + off[i + 1]);
    }
    return out;
}

// log-softmax of row [V] at token t, and its argmax (ties to the smaller id)
std::pair<int64_t, float> greedy(const float* row, int64_t V) {
    const int64_t best = std::max_element(row, row + V) - row;
    double sum = 0;
    for (int64_t v = 0; v < V; ++v)
        sum += std::exp(static_cast<double>(row[v] - row[best]));
    return {best, static_cast<float>(-std::log(sum))};
}

// The request's greedy continuation by hand: encode its images, splice, prefill whole, decode.
Output by_hand(const model::Model& m, const io::Request& r) {
    const model::ModelConfig& cfg = m.cfg;
    const int64_t d = cfg.hidden_size, V = cfg.vocab_size;
    model::MediaSplice media;
    if (!r.images.empty()) {
        io::ImageOptions o;
        o.patch = cfg.vision.patch_size, o.unit = cfg.vision.merge;
        std::vector<io::Image> imgs;
        std::vector<model::VisionImage> views;
        int64_t n = 0;
        for (const std::string& f : r.images)
            imgs.push_back(io::load_image(f, o));
        for (const io::Image& im : imgs) {
            views.push_back({im.grid_h, im.grid_w, im.pixels.data()});
            n += model::vision_tokens(cfg.vision, im.grid_h, im.grid_w, 1);
        }
        media.embeds = Buffer(DType::f32, {n, d});
        model::vision_forward(cfg, m.vision, views, 1, media.embeds.view());
        for (size_t t = 0; t < r.tokens.size(); ++t)
            if (r.tokens[t] == cfg.vision.media_token_id)
                media.rows.push_back(static_cast<int64_t>(t));
    }
    model::SequenceState st = model::make_sequence_state(m);
    model::ForwardOptions fo;
    fo.logits = model::Logits::last;
    fo.media = &media;
    Buffer logits;
    const auto T = static_cast<int64_t>(r.tokens.size());
    model::forward(m, r.tokens, model::single_sequence(T, 0), {&st}, logits, fo);
    Output out;
    const int max_new = r.max_new_tokens >= 0 ? r.max_new_tokens : kMaxNew;
    for (int k = 0; k < max_new; ++k) {
        const auto [tok, lp] = greedy(logits.ptr<float>(), V);
        out.tokens.push_back(tok);
        out.logprobs.push_back(lp);
        if (k + 1 == max_new)
            break;
        model::ForwardOptions step;
        step.logits = model::Logits::last;
        model::forward(m, {tok}, model::single_sequence(1, st.n_tokens), {&st}, logits, step);
    }
    return out;
}

// a request file in out-bad/ with the deck's requests and one more line
std::string requests_with(const std::string& extra) {
    const fs::path dir = fs::absolute(kDir + "out-bad");
    fs::create_directories(dir);
    const fs::path path = dir / "requests.jsonl";
    std::ofstream out(path);
    std::ifstream in(kDir + "requests.jsonl");
    for (std::string line; std::getline(in, line);) {
        // the deck's image paths are relative to tests/decks/vision/: make them absolute
        const std::string rel = "../../../inputs/images/";
        for (size_t at; (at = line.find(rel)) != std::string::npos;)
            line.replace(at, rel.size(), fs::absolute("inputs/images").string() + "/");
        out << line << "\n";
    }
    out << extra << "\n";
    return path.string();
}

}  // namespace

BOOST_AUTO_TEST_SUITE(vision_e2e)

BOOST_AUTO_TEST_CASE(engine_with_images_equals_encoding_and_splicing_by_hand) {
    fs::remove_all(kDir + "out");
    auto r = run_hymoe(kDeck);
    BOOST_REQUIRE_MESSAGE(r.code == 0, r.err);
    const auto results = read_results(kDir + "out/results.h5");
    BOOST_TEST(results.size() == 5u);

    model::Model m = model::make_model(model::preset_config("tiny"));
    model::init_model_random(m, kSeed);
    auto reader = io::open_requests(kDir + "requests.jsonl");
    int with_images = 0;
    for (io::Request q; reader->next(q);) {
        BOOST_TEST_CONTEXT("request " << q.id) {
            with_images += !q.images.empty();
            const Output hand = by_hand(m, q);
            BOOST_REQUIRE(results.count(q.id) == 1);
            const Output& run = results.at(q.id);
            BOOST_TEST(run.tokens == hand.tokens, boost::test_tools::per_element());
            BOOST_REQUIRE(run.logprobs.size() == hand.logprobs.size());
            for (size_t k = 0; k < hand.logprobs.size(); ++k)
                BOOST_TEST(std::fabs(run.logprobs[k] - hand.logprobs[k]) <= 1e-4f);
        }
    }
    BOOST_TEST(with_images == 3);

    // the splice matters: without it the image requests would continue differently
    auto reader2 = io::open_requests(kDir + "requests.jsonl");
    int differ = 0;
    for (io::Request q; reader2->next(q);)
        if (!q.images.empty()) {
            q.images.clear();
            differ += by_hand(m, q).logprobs != results.at(q.id).logprobs;
        }
    BOOST_TEST(differ == 3);

    io::H5Reader prof(kDir + "out/profile.h5");
    BOOST_TEST(prof.ints("/vision/images")[0] == 4);   // 1 + 2 + 1
    BOOST_TEST(prof.ints("/vision/tokens")[0] == 47);  // 24 + 15 + 4 + 4
    BOOST_TEST(prof.ints("/vision/patches")[0] == 4 * 47);
    BOOST_TEST(prof.ints("/vision/weight_bytes")[0] == model::count_params(m.cfg).vision * 4);
    BOOST_TEST(prof.ints("/vision/activation_bytes")[0] > 0);
    BOOST_TEST(prof.floats("/vision/seconds")[0] > 0.0f);
}

// tp2 and pp2 (np 2), and a 7-page KV pool that preempts image requests (np 1: a preempted
// sequence keeps its image tokens and restarts from its prompt), against the one-rank run.
BOOST_AUTO_TEST_CASE(two_ranks_and_preemption_equal_one_rank) {
    fs::remove_all(kDir + "out");
    auto one = run_hymoe(kDeck + " --set job.output=out/np1");
    BOOST_REQUIRE_MESSAGE(one.code == 0, one.err);
    const auto ref = read_results(kDir + "out/np1/results.h5");
    struct Variant {
        std::string name, sets;
        int np;
    };
    const Variant variants[] = {
        {"tp2", " --set parallel.tp=2", 2},
        {"pp2", " --set parallel.pp=2", 2},
        {"preempt", " --set inference.kv_cache.pages=7 --set inference.kv_cache.page_tokens=8", 0},
    };
    for (const Variant& v : variants) {
        BOOST_TEST_CONTEXT(v.name) {
            auto two = run_hymoe(kDeck + " --set job.output=out/" + v.name + v.sets, v.np);
            BOOST_REQUIRE_MESSAGE(two.code == 0, two.err);
            if (v.name == "preempt")
                BOOST_TEST((two.out + two.err).find(", 0 preemptions") == std::string::npos,
                           two.out);
            const auto got = read_results(kDir + "out/" + v.name + "/results.h5");
            BOOST_TEST(got.size() == ref.size());
            for (const auto& [id, o] : ref) {
                BOOST_REQUIRE(got.count(id) == 1);
                BOOST_TEST(got.at(id).tokens == o.tokens, boost::test_tools::per_element());
                for (size_t k = 0; k < o.logprobs.size(); ++k)
                    BOOST_TEST(std::fabs(got.at(id).logprobs[k] - o.logprobs[k]) <=
                               1e-5f * std::max(1.0f, std::fabs(o.logprobs[k])));
            }
            io::H5Reader prof(kDir + "out/" + v.name + "/profile.h5");
            BOOST_TEST(prof.ints("/vision/tokens")[0] == 47);  // once per image, whatever the tp
        }
    }
    fs::remove_all(kDir + "out");
}

BOOST_AUTO_TEST_CASE(bad_images_exit_3_naming_the_request_and_file) {
    fs::create_directories(kDir + "out-bad");
    const std::string broken = fs::absolute(kDir + "out-bad/broken.png").string();
    std::ofstream(broken) << "\x89PNG\r\n\x1a\n truncated";
    const std::string cases[][3] = {
        {R"({"id": "bad-file", "tokens": [3, 3, 3, 3, 9], "images": [")" + broken + R"("]})",
         "bad-file",
         "broken.png"},
        {R"({"id": "no-file", "tokens": [3, 3, 3, 3, 9], "images": ["missing.jpg"]})",
         "no-file",
         "missing.jpg"},
        {R"({"id": "count", "tokens": [3, 3, 3, 9], "images": [")" +
             fs::absolute("inputs/images/checker.png").string() + R"("]})",
         "count",
         "3 media placeholder tokens"},
    };
    for (const auto& c : cases) {
        BOOST_TEST_CONTEXT(c[1]) {
            const std::string reqs = requests_with(c[0]);
            const std::string set =
                " --set inference.dataset=" + reqs + " --set job.output=out-bad/o";
            auto r = run_hymoe(kDeck + set);
            BOOST_TEST(r.code == 3, r.err);
            BOOST_TEST(r.err.find("request " + c[1]) != std::string::npos, r.err);
            BOOST_TEST(r.err.find(c[2]) != std::string::npos, r.err);
            auto skip = run_hymoe(kDeck + set + " --set inference.on_bad_request=skip");
            BOOST_TEST(skip.code == 0, skip.err);
            BOOST_TEST(read_results(kDir + "out-bad/o/results.h5").size() == 5u);
            fs::remove_all(kDir + "out-bad/o");
        }
    }
    // oversized: the 48x32 PNG above a 1000-pixel limit
    auto big = run_hymoe(kDeck + " --set inference.images.max_pixels=1000");
    BOOST_TEST(big.code == 3, big.err);
    BOOST_TEST(big.err.find("request img-1") != std::string::npos, big.err);
    BOOST_TEST(big.err.find("gradient.png") != std::string::npos, big.err);
    BOOST_TEST(big.err.find("oversized") != std::string::npos, big.err);
    // pooling 2×2 cuts img-1's 24 tokens to 6: its 24 placeholders no longer match
    auto pooled = run_hymoe(kDeck + " --set inference.images.pool=2");
    BOOST_TEST(pooled.code == 3, pooled.err);
    BOOST_TEST(pooled.err.find("request img-1: 24 media placeholder tokens (id 3) but its 1 "
                               "image(s) make 6 image tokens") != std::string::npos,
               pooled.err);
    fs::remove_all(kDir + "out-bad");
    fs::remove_all(kDir + "out");
}

// The vision weights load by their Kimi-VL names from safetensors: the seeded model written as one
// fp32 model.safetensors with the preset as a native config.json gives the init: random run's
// results exactly.
BOOST_AUTO_TEST_CASE(vision_weights_load_from_safetensors_by_name) {
    const std::string dir = fs::absolute(kDir + "out-st").string();
    fs::remove_all(dir);
    fs::create_directories(dir);
    model::Model m = model::make_model(model::preset_config("tiny"));
    model::init_model_random(m, kSeed);
    std::vector<std::pair<std::string, Tensor>> tensors;
    int vision = 0;
    for (const model::TensorSpec& t : model::model_tensors(m)) {
        tensors.emplace_back(t.name, t.dest->view());
        vision +=
            t.name.starts_with("vision_tower.") || t.name.starts_with("multi_modal_projector.");
    }
    BOOST_TEST(vision == 3 + 2 * 12 + 2 + 6);  // patch + pos, 2 blocks, final LN, projector
    io::write_safetensors(dir + "/model.safetensors", tensors, {}, DType::f32);
    std::ofstream(dir + "/config.json") << model::to_json(m.cfg);
    fs::remove_all(kDir + "out");
    auto ref = run_hymoe(kDeck + " --set job.output=out/random");
    BOOST_REQUIRE_MESSAGE(ref.code == 0, ref.err);
    std::ofstream(dir + "/deck.yaml")
        << "job: {kind: infer, seed: 11, output: out}\n"
           "model: {config: config.json, weights: ., dtype: fp32}\n"
           "inference:\n"
           "  dataset: "
        << fs::absolute(kDir + "requests.jsonl").string()
        << "\n"
           "  max_new_tokens: 8\n"
           "  prompt_logprobs: true\n"
           "  batch: {max_tokens: 64, max_seqs: 4, prefill_chunk: 16}\n";
    auto st = run_hymoe(dir + "/deck.yaml");
    BOOST_REQUIRE_MESSAGE(st.code == 0, st.err);
    const auto a = read_results(kDir + "out/random/results.h5");
    const auto b = read_results(dir + "/out/results.h5");
    BOOST_REQUIRE(a.size() == b.size());
    for (const auto& [id, o] : a) {
        BOOST_TEST(b.at(id).tokens == o.tokens, boost::test_tools::per_element());
        BOOST_TEST(b.at(id).logprobs == o.logprobs, boost::test_tools::per_element());
    }
    fs::remove_all(dir);
    fs::remove_all(kDir + "out");
}

BOOST_AUTO_TEST_SUITE_END()
