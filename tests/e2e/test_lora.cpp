// The lora job through the binary: the loss curve, gradient norms and adapters are the same at
// one rank, with gradient accumulation and at dp2, pp2, tp2, ep2, tp2·ep2 and dp2·pp2 for the same
// global batch (≤ 1e-5 relative); a run stopped by
// job.max_hours (exit 75) and rerun gives bit-identical losses, and resumes at another layout
// (dp2 → one rank with grad_accum 2) to ≤ 1e-5; a
// checkpoint with a flipped byte, or written for another model, is refused with exit 4; the
// loss-spike guard names the step and stops with exit 3; and the demo: lora-quickstart learns the
// cipher (domain accuracy from chance to ≥ 0.9, general eval loss within 10%) and lora-infer
// answers held-out prompts with the adapter and not without it, in the same batches.
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include <boost/test/unit_test.hpp>
#include <nlohmann/json.hpp>

#include "hymoe/io/h5.h"
#include "hymoe/io/safetensors.h"
#include "hymoe/tensor/tensor.h"
#include "run_binary.h"

namespace fs = std::filesystem;
using namespace hymoe;

namespace {

const std::string kDeck = "tests/decks/lora/small.yaml";

std::string scratch(const std::string& name) {
    const fs::path p = fs::temp_directory_path() / ("hymoe-lora-" + name);
    fs::remove_all(p);
    return p.string();
}

std::vector<float> losses(const std::string& out) {
    return io::H5Reader(out + "/results.h5").floats("/train/loss");
}

double max_rel(const std::vector<float>& a, const std::vector<float>& b) {
    BOOST_REQUIRE_EQUAL(a.size(), b.size());
    double m = 0;
    for (size_t i = 0; i < a.size(); ++i)
        m = std::max(m,
                     std::abs(static_cast<double>(a[i]) - static_cast<double>(b[i])) /
                         std::abs(static_cast<double>(b[i])));
    return m;
}

testing::RunResult train(const std::string& out, const std::string& extra = "", int np = 1) {
    return testing::run_hymoe(kDeck + " --set job.output=" + out + " " + extra, np);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(lora_job)

// The largest difference over every tensor of two safetensors files (the same names), relative to
// the largest value of the second.
double tensors_max_rel(const std::string& a, const std::string& b) {
    const io::SafetensorsFile fa(a), fb(b);
    BOOST_REQUIRE(fa.names() == fb.names());
    double diff = 0, scale = 0;
    for (const std::string& name : fa.names()) {
        Buffer ta(DType::f32, fa.info(name).shape), tb(DType::f32, fb.info(name).shape);
        fa.read(name, ta.view());
        fb.read(name, tb.view());
        for (int64_t i = 0; i < shape_numel(ta.view().shape); ++i) {
            diff = std::max(diff,
                            std::abs(static_cast<double>(ta.ptr<float>()[i] - tb.ptr<float>()[i])));
            scale = std::max(scale, std::abs(static_cast<double>(tb.ptr<float>()[i])));
        }
    }
    return diff / scale;
}

// The same global batch of 4 rows (1 row × 4 micro-batches on one rank) at every layout: the
// replicas split the micro-batches, pp runs them 1F1B, tp and ep split the blocks. Without
// dropout the loss curve, the gradient norms, the exported adapters and the merged weights equal
// one rank's (≤ 1e-5 relative; the adapters to 1e-2, see below). Dropout masks are keyed by a row's
// place in its micro-batch and the adapter's name (model/lora.h), so under dp and pp, which do not
// split a block, they are the one-rank masks.
BOOST_AUTO_TEST_CASE(every_layout_gives_the_one_rank_loss_curve) {
    const std::string base =
        "--set finetune.steps=5 --set finetune.batch.micro_batch=1 --set finetune.eval.every=5 "
        "--set finetune.export_merged=true ";
    const std::string no_dropout = base + "--set finetune.lora.dropout=0 ";
    const std::string ref = scratch("ref");
    BOOST_REQUIRE_EQUAL(train(ref, no_dropout + "--set finetune.batch.grad_accum=4").code, 0);
    const std::vector<float> ref_loss = losses(ref);
    BOOST_TEST(ref_loss.size() == 5u);
    BOOST_TEST(ref_loss.back() < ref_loss.front());
    const nlohmann::json j =
        nlohmann::json::parse(testing::read_text(ref + "/adapters/final/adapter_config.json"));
    BOOST_TEST(j["peft_type"] == "LORA");
    BOOST_TEST(j["r"] == 4);
    struct Layout {
        std::string set;
        int np;
    };
    const std::vector<Layout> layouts = {
        {"finetune.batch.micro_batch=2 --set finetune.batch.grad_accum=2", 1},
        {"parallel.dp=2 --set finetune.batch.grad_accum=2", 2},
        {"parallel.pp=2 --set finetune.batch.grad_accum=4", 2},
        {"parallel.tp=2 --set finetune.batch.grad_accum=4", 2},
        {"parallel.dp=2 --set parallel.ep=2 --set finetune.batch.grad_accum=2", 2},
        {"parallel.tp=2 --set parallel.ep=2 --set finetune.batch.grad_accum=4", 2},
        {"parallel.tp=2 --set parallel.dp=2 --set parallel.ep=4 --set finetune.batch.grad_accum=2",
         4},
        {"parallel.dp=2 --set parallel.pp=2 --set finetune.batch.grad_accum=2", 4}};
    for (size_t i = 0; i < layouts.size(); ++i) {
        const std::string out = scratch("layout" + std::to_string(i));
        const testing::RunResult r =
            train(out, no_dropout + "--set " + layouts[i].set, layouts[i].np);
        BOOST_REQUIRE_MESSAGE(r.code == 0, layouts[i].set << ": " << r.out);
        BOOST_TEST(max_rel(losses(out), ref_loss) <= 1e-5, layouts[i].set);
        const std::vector<float> gn = io::H5Reader(out + "/results.h5").floats("/train/grad_norm");
        BOOST_TEST(
            max_rel(gn, io::H5Reader(ref + "/results.h5").floats("/train/grad_norm")) <= 1e-4,
            layouts[i].set);
        // AdamW divides each element by its own gradient scale, so elements whose gradient is
        // near zero carry rounding up to ~1e-3 of the largest value; a misplaced slice is O(1)
        BOOST_TEST(tensors_max_rel(out + "/adapters/final/adapter_model.safetensors",
                                   ref + "/adapters/final/adapter_model.safetensors") <= 1e-2,
                   layouts[i].set);
        BOOST_TEST(tensors_max_rel(out + "/merged/model.safetensors",
                                   ref + "/merged/model.safetensors") <= 1e-5,
                   layouts[i].set);
    }
    // with dropout: dp2·pp2 draws the one-rank masks
    const std::string one = scratch("drop-one"), wide = scratch("drop-dp2pp2");
    BOOST_REQUIRE_EQUAL(train(one, base + "--set finetune.batch.grad_accum=4").code, 0);
    BOOST_REQUIRE_EQUAL(
        train(wide,
              base + "--set parallel.dp=2 --set parallel.pp=2 --set finetune.batch.grad_accum=2",
              4)
            .code,
        0);
    BOOST_TEST(max_rel(losses(wide), losses(one)) <= 1e-5);
}

BOOST_AUTO_TEST_CASE(a_stopped_run_resumes_bit_identically_and_at_another_layout) {
    const std::string whole = scratch("whole"), cut = scratch("cut");
    BOOST_REQUIRE_EQUAL(train(whole).code, 0);
    const testing::RunResult stopped = train(cut, "--set job.max_hours=1e-9");
    BOOST_REQUIRE_EQUAL(stopped.code, 75);
    BOOST_TEST(fs::exists(cut + "/checkpoints/step_1/manifest.json"));
    const testing::RunResult resumed = train(cut);
    BOOST_REQUIRE_EQUAL(resumed.code, 0);
    BOOST_TEST(resumed.out.find("resuming from") != std::string::npos, resumed.out);
    BOOST_TEST(losses(cut) == losses(whole));  // bit for bit
    // saved at dp2, resumed at one rank
    const std::string wide = scratch("wide"), moved = scratch("moved");
    const std::string no_dropout = "--set finetune.lora.dropout=0 ";
    BOOST_REQUIRE_EQUAL(train(wide, no_dropout + "--set parallel.dp=2", 2).code, 0);
    BOOST_REQUIRE_EQUAL(
        train(moved, no_dropout + "--set parallel.dp=2 --set job.max_hours=1e-9", 2).code, 75);
    BOOST_REQUIRE_EQUAL(train(moved, no_dropout + "--set finetune.batch.grad_accum=2").code, 0);
    BOOST_TEST(max_rel(losses(moved), losses(wide)) <= 1e-5);
}

// The binary started in the background with a checkpoint every step; `sig` sent once step_2 is
// on disk (so mid-step or mid-write); returns the exit code.
int interrupted_run(const std::string& out, int sig) {
    const char* bin = std::getenv("HYMOE_BIN");
    const std::string exe = bin ? bin : "build/hymoe", pidfile = out + ".pid", rcfile = out + ".rc";
    fs::remove(pidfile), fs::remove(rcfile);
    std::system(
        ("(" + exe + " " + kDeck + " --set job.output=" + out +
         " --set finetune.steps=12 --set finetune.checkpoint.every=1 >/dev/null 2>&1 & echo $! >" +
         pidfile + ".tmp; mv " + pidfile + ".tmp " + pidfile + "; wait $!; echo $? >" + rcfile +
         ".tmp; mv " + rcfile + ".tmp " + rcfile + ") &")
            .c_str());
    for (int i = 0; i < 400 && !fs::exists(pidfile); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const pid_t pid = std::stoi(testing::read_text(pidfile));
    for (int i = 0; i < 4000 && !fs::exists(out + "/checkpoints/step_2/manifest.json"); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
    ::kill(pid, sig);
    for (int i = 0; i < 4000 && !fs::exists(rcfile); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    return std::stoi(testing::read_text(rcfile));
}

// kill -9 while checkpoints are being written every step: the results.h5 written so far holds a
// prefix of the run's losses; the rerun resumes from the newest complete checkpoint and ends
// bit-identical to an uninterrupted run; SIGUSR1 stops at the next step
// boundary with a checkpoint and exit 75, naming the signal.
BOOST_AUTO_TEST_CASE(kill_9_and_sigusr1_mid_run_then_resume) {
    const std::string ref = scratch("ref12"), killed = scratch("killed"), usr1 = scratch("usr1");
    const std::string twelve = "--set finetune.steps=12 --set finetune.checkpoint.every=1";
    BOOST_REQUIRE_EQUAL(train(ref, twelve).code, 0);
    BOOST_TEST(interrupted_run(killed, SIGKILL) == 128 + SIGKILL);
    {  // the results.h5 streamed so far: a bit-identical prefix of the whole run's
        const std::vector<float> part = losses(killed), whole = losses(ref);
        BOOST_TEST((part.size() >= 1u && part.size() < 12u));
        BOOST_TEST(part == std::vector<float>(whole.begin(), whole.begin() + part.size()));
    }
    const testing::RunResult again = train(killed, twelve);
    BOOST_REQUIRE_EQUAL(again.code, 0);
    BOOST_TEST(again.out.find("resuming from") != std::string::npos, again.out);
    BOOST_TEST(losses(killed) == losses(ref));
    BOOST_TEST(interrupted_run(usr1, SIGUSR1) == 75);
    BOOST_TEST(testing::read_text(usr1 + "/log").find("(SIGUSR1)") != std::string::npos);
    BOOST_REQUIRE_EQUAL(train(usr1, twelve).code, 0);
    BOOST_TEST(losses(usr1) == losses(ref));
}

// Image-text data (tests/decks/lora/vision.h5: images spliced over the placeholders, captions
// as targets): the tower is frozen (the adapter holds language-model modules only) and the
// caption loss falls; a document whose placeholders miss an image token is exit 3 naming it.
BOOST_AUTO_TEST_CASE(image_text_data_trains_with_the_tower_frozen) {
    const std::string out = scratch("vision");
    const std::string data =
        "--set finetune.data.domain=vision.h5 --set finetune.data.domain_ratio=1 "
        "--set finetune.data.general_ratio=0 --set finetune.batch.seq_len=64 ";
    BOOST_REQUIRE_EQUAL(
        train(out, data + "--set finetune.eval.domain=vision.h5 --set finetune.steps=12").code, 0);
    const std::vector<float> d = io::H5Reader(out + "/results.h5").floats("/eval/domain_loss");
    BOOST_TEST(d.back() < 0.9f * d.front());
    const std::string cfg = testing::read_text(out + "/adapters/final/adapter_config.json");
    for (const std::string m : nlohmann::json::parse(cfg)["target_modules"])
        BOOST_TEST(m.find("vision") == std::string::npos, m);
    const testing::RunResult bad = train(scratch("vision-bad"),
                                         "--set finetune.data.domain=vision_bad.h5 "
                                         "--set finetune.data.domain_ratio=1 "
                                         "--set finetune.data.general_ratio=0 "
                                         "--set finetune.batch.seq_len=64");
    BOOST_TEST(bad.code == 3, bad.err);
    BOOST_TEST(bad.err.find("vision_bad.h5: document 3") != std::string::npos, bad.err);
}

// An adapter on every target (attention, dense FFN, shared and routed experts) served per request
// next to the base model in the same batches (jobs/lora-infer's prompts, each with and without
// it): the one-rank tokens and logprobs at tp2, pp2, dp2·ep2 and tp2·ep2 (≤ 1e-5), the expert
// rows carrying their request's adapter through the dispatch; and the adapter changes them.
// Expert rebalancing with it (dp2·ep2) exits 2 naming parallel.rebalance_every.
BOOST_AUTO_TEST_CASE(ffn_adapters_apply_per_request_at_every_layout) {
    const std::string trained = scratch("ffn-adapter");
    BOOST_REQUIRE_EQUAL(train(trained, "--set finetune.lora.dropout=0").code, 0);
    const std::string adapter = fs::absolute(trained + "/adapters/final").string();
    auto infer = [&](const std::string& name, const std::string& layout, int np) {
        const std::string out = scratch("ffn-infer-" + name);
        const testing::RunResult r =
            testing::run_hymoe("jobs/lora-infer/deck.yaml --set job.output=" + out +
                                   " --set inference.adapters.cipher=" + adapter + " " + layout,
                               np);
        BOOST_REQUIRE_MESSAGE(r.code == 0, name << ": " << r.err);
        return out + "/results.h5";
    };
    io::H5Reader one(infer("one", "", 1));
    const std::vector<std::string> ids = one.strings("/requests/id");
    const std::vector<float> lp = one.floats("/requests/output_logprobs");
    // lora-N and base-N hold the same prompt: their logprobs differ by the adapter
    std::map<std::string, float> base;
    for (size_t i = 0; i < ids.size(); ++i)
        if (ids[i].substr(0, 4) == "base")
            base[ids[i].substr(5)] = lp[i];
    float moved = 0;
    for (size_t i = 0; i < ids.size(); ++i)
        if (ids[i].substr(0, 4) == "lora")
            moved = std::max(moved, std::abs(lp[i] - base.at(ids[i].substr(5))));
    BOOST_TEST(moved > 1e-3f);
    const std::vector<std::pair<std::string, int>> layouts = {
        {"--set parallel.tp=2", 2},
        {"--set parallel.pp=2", 2},
        {"--set parallel.dp=2 --set parallel.ep=2", 2},
        {"--set parallel.tp=2 --set parallel.ep=2", 2}};
    for (size_t l = 0; l < layouts.size(); ++l) {
        io::H5Reader o(infer("layout" + std::to_string(l), layouts[l].first, layouts[l].second));
        BOOST_TEST(o.strings("/requests/id") == ids, layouts[l].first);
        BOOST_TEST(o.ints("/requests/output_tokens") == one.ints("/requests/output_tokens"),
                   layouts[l].first);
        const std::vector<float> b = o.floats("/requests/output_logprobs");
        BOOST_REQUIRE_EQUAL(b.size(), lp.size());
        float worst = 0;
        for (size_t i = 0; i < b.size(); ++i)
            worst = std::max(worst, std::abs(b[i] - lp[i]));
        BOOST_TEST(worst <= 1e-5f, layouts[l].first);
    }
    // expert rebalancing would move the experts without their adapters: refused in one sentence,
    // nothing written
    const std::string moving_out = scratch("ffn-infer-moving");
    const testing::RunResult moving = testing::run_hymoe(
        "jobs/lora-infer/deck.yaml --set job.output=" + moving_out +
            " --set inference.adapters.cipher=" + adapter +
            " --set parallel.dp=2 --set parallel.ep=2 --set parallel.rebalance_every=4",
        2);
    BOOST_TEST(moving.code == 2, moving.err);
    BOOST_TEST(moving.err_lines().size() == 1u, moving.err);
    BOOST_TEST(!fs::exists(moving_out));
    BOOST_TEST(moving.err.find("parallel.rebalance_every: 4, but an adapter of inference.adapters "
                               "adapts the routed experts") != std::string::npos,
               moving.err);
}

BOOST_AUTO_TEST_CASE(a_corrupt_or_foreign_checkpoint_is_refused_with_4) {
    const std::string out = scratch("corrupt");
    BOOST_REQUIRE_EQUAL(train(out, "--set job.max_hours=1e-9").code, 75);
    // another model config
    const testing::RunResult other = train(out, "--set model.preset=tiny-kimi");
    BOOST_TEST(other.code == 4, other.err);
    BOOST_TEST(other.err.find("another model config") != std::string::npos, other.err);
    // a flipped byte in the data of a tensor file
    const std::string dir = out + "/checkpoints/step_1";
    std::string victim;
    for (const auto& e : fs::directory_iterator(dir))
        if (e.path().extension() == ".h5")
            victim = e.path().string();
    BOOST_REQUIRE(!victim.empty());
    {
        std::fstream f(victim, std::ios::in | std::ios::out | std::ios::binary);
        f.seekg(0, std::ios::end);
        const auto size = static_cast<std::streamoff>(f.tellg());
        f.seekg(size - 64);
        char c = 0;
        f.read(&c, 1);
        f.seekp(size - 64);
        c = static_cast<char>(c ^ 0x5a);
        f.write(&c, 1);
    }
    const testing::RunResult bad = train(out);
    BOOST_TEST(bad.code == 4, bad.out + bad.err);
    const bool named = bad.err.find("sha256") != std::string::npos ||
                       bad.err.find("checksum") != std::string::npos;
    BOOST_TEST(named, bad.err);
}

BOOST_AUTO_TEST_CASE(the_loss_spike_guard_names_the_step) {
    const std::string out = scratch("spike");
    // a spike threshold of 1e-6 × the recent mean: the first step after five good ones trips it
    const testing::RunResult r =
        train(out, "--set finetune.loss_spike=1e-6 --set finetune.steps=8");
    BOOST_TEST(r.code == 3, r.err);
    BOOST_TEST(r.err.find("step 6: loss") != std::string::npos, r.err);
    const testing::RunResult skip = train(
        scratch("spike-skip"),
        "--set finetune.loss_spike=1e-6 --set finetune.steps=8 --set finetune.on_nonfinite=skip");
    BOOST_TEST(skip.code == 0, skip.err);
    BOOST_TEST(skip.out.find("batch skipped") != std::string::npos, skip.out);
}

BOOST_AUTO_TEST_CASE(the_demo_learns_the_cipher_and_infer_uses_the_adapter) {
    const std::string out = scratch("demo"), infer = scratch("demo-infer");
    BOOST_REQUIRE_EQUAL(
        testing::run_hymoe(
            "jobs/lora-quickstart/deck.yaml --set finetune.export_merged=true --set job.output=" +
                out,
            1)
            .code,
        0);
    io::H5Reader r(out + "/results.h5");
    const std::vector<float> acc = r.floats("/eval/domain_accuracy");
    const std::vector<float> general = r.floats("/eval/general_loss");
    BOOST_TEST_MESSAGE("domain accuracy " << acc.front() << " -> " << acc.back()
                                          << ", general loss " << general.front() << " -> "
                                          << general.back());
    BOOST_TEST(acc.front() <= 0.05f);
    BOOST_TEST(acc.back() >= 0.9f);
    BOOST_TEST(std::abs(general.back() - general.front()) <= 0.1f * general.front());
    const testing::RunResult run = testing::run_hymoe(
        "jobs/lora-infer/deck.yaml --set job.output=" + infer +
            " --set inference.adapters.cipher=" + fs::absolute(out + "/adapters/final").string(),
        1);
    BOOST_REQUIRE_EQUAL(run.code, 0);
    std::map<std::string, int64_t> expect;
    std::ifstream in("inputs/data/lora-demo/cipher_prompts.jsonl");
    for (std::string line; std::getline(in, line);) {
        const nlohmann::json j = nlohmann::json::parse(line);
        expect[j["id"]] = j["expect"];
    }
    io::H5Reader res(infer + "/results.h5");
    const std::vector<std::string> ids = res.strings("/requests/id");
    const std::vector<int64_t> tokens = res.ints("/requests/output_tokens");
    const std::vector<int64_t> offsets = res.ints("/requests/output_offsets");
    std::map<std::string, int> right, total;
    for (size_t i = 0; i < ids.size(); ++i) {
        const std::string kind = ids[i].substr(0, 4);
        total[kind] += 1;
        right[kind] += tokens[offsets[i]] == expect[ids[i]];
    }
    BOOST_TEST_MESSAGE("held-out prompts: with the adapter "
                       << right["lora"] << "/" << total["lora"] << ", base " << right["base"] << "/"
                       << total["base"]);
    BOOST_TEST(total["lora"] == 64);
    BOOST_TEST(right["lora"] >= 58);  // ≥ 90%
    BOOST_TEST(right["base"] <= 6);

    // the adapters at tp2 and pp2: each rank takes its slices and its stage's modules
    for (const std::string layout : {"parallel.tp=2", "parallel.pp=2"}) {
        const std::string other = scratch("demo-infer-" + layout.substr(9, 2));
        BOOST_REQUIRE_EQUAL(testing::run_hymoe("jobs/lora-infer/deck.yaml --set job.output=" +
                                                   other + " --set inference.adapters.cipher=" +
                                                   fs::absolute(out + "/adapters/final").string() +
                                                   " --set " + layout,
                                               2)
                                .code,
                            0);
        io::H5Reader o(other + "/results.h5");
        BOOST_TEST(o.ints("/requests/output_tokens") == tokens, layout);
        const std::vector<float> a = o.floats("/requests/output_logprobs");
        const std::vector<float> b = res.floats("/requests/output_logprobs");
        BOOST_REQUIRE_EQUAL(a.size(), b.size());
        for (size_t i = 0; i < a.size(); ++i)
            BOOST_TEST(std::abs(a[i] - b[i]) <= 1e-5f, layout);
    }

    // the merged weights (out/merged: safetensors + config.json) answer like base + adapter
    const std::string merged = scratch("demo-merged");
    fs::create_directories(merged);
    std::ofstream(merged + "/deck.yaml")
        << "job: {kind: infer, seed: 1234, output: out}\n"
        << "model: {config: " << out << "/merged/config.json, weights: " << out
        << "/merged, dtype: fp32}\n"
        << "inference:\n  dataset: "
        << fs::absolute("inputs/data/lora-demo/cipher_prompts.jsonl").string()
        << "\n  on_bad_request: skip\n  max_new_tokens: 1\n  sampling: {temperature: 0.0}\n";
    BOOST_REQUIRE_EQUAL(testing::run_hymoe(merged + "/deck.yaml", 1).code, 0);
    io::H5Reader mr(merged + "/out/results.h5");
    const std::vector<std::string> mids = mr.strings("/requests/id");
    const std::vector<int64_t> mtok = mr.ints("/requests/output_tokens");
    std::map<std::string, int64_t> with_adapter;
    for (size_t i = 0; i < ids.size(); ++i)
        if (ids[i].substr(0, 4) == "lora")
            with_adapter[ids[i].substr(5)] = tokens[offsets[i]];
    int same = 0;
    for (size_t i = 0; i < mids.size(); ++i)  // the base-* rows (adapter rows are skipped here)
        same += mtok[i] == with_adapter[mids[i].substr(5)];
    BOOST_TEST(mids.size() == 64u);
    BOOST_TEST(same == 64);
}

BOOST_AUTO_TEST_SUITE_END()
