// Generation (runtime/engine.h) in process and through the binary: a mixed-length batch yields
// exactly the tokens of running each request alone (greedy and sampled); chunked prefill equals
// unchunked; results are identical across max_seqs 1, 4, 32; eos stops a sequence; and the
// binary's results.h5 survives kill -9 (the rerun equals an uninterrupted run) and is read back
// by h5py.
#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include "hymoe/backend/ops.h"
#include "hymoe/core/rng.h"
#include "hymoe/io/h5.h"
#include "hymoe/model/model.h"
#include "hymoe/runtime/engine.h"
#include "run_binary.h"

namespace fs = std::filesystem;
namespace data = boost::unit_test::data;
using namespace hymoe;
using runtime::EngineOptions;
using runtime::Finished;
using runtime::Pending;

namespace {

const model::Model& tiny() {
    static model::Model m = [] {
        model::Model x = model::make_model(model::preset_config("tiny"));
        model::init_model_random(x, 7);
        return x;
    }();
    return m;
}

// 24 requests of 1..40 tokens (ids 3..255), some with their own max_new_tokens (0, 1 or 5).
std::vector<Pending> requests() {
    std::vector<Pending> reqs;
    Philox rng(11, 0, 0);
    for (int i = 0; i < 24; ++i) {
        Pending p;
        p.index = i;
        p.req.id = "r" + std::to_string(i);
        p.req.line = i + 1;
        const int64_t len = 1 + rng.next_u32() % 40;
        for (int64_t t = 0; t < len; ++t)
            p.req.tokens.push_back(3 + rng.next_u32() % 253);
        const int own[] = {-1, -1, -1, 0, 1, 5};
        p.req.max_new_tokens = own[i % 6];
        reqs.push_back(p);
    }
    return reqs;
}

std::vector<Finished> run(const EngineOptions& o, const std::vector<Pending>& reqs) {
    size_t next = 0;
    std::vector<Finished> out;
    runtime::run_engine(
        tiny(),
        o,
        [&](Pending& p) {
            if (next == reqs.size())
                return false;
            p = reqs[next++];
            return true;
        },
        [&](Finished&& f) { out.push_back(std::move(f)); });
    std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.index < b.index; });
    return out;
}

EngineOptions options(double temperature, int max_seqs, int prefill_chunk) {
    EngineOptions o;
    o.max_seqs = max_seqs, o.max_tokens = 256, o.prefill_chunk = prefill_chunk;
    o.max_new_tokens = 12, o.seed = 3, o.progress_every_s = 0;
    o.sampling = {temperature, temperature > 0 ? 40 : 0, temperature > 0 ? 0.9 : 1.0};
    return o;
}

// Same tokens and finish reasons; logprobs within tol. Tokens must match exactly; logprobs differ
// by up to ~5e-7 between batchings because OpenBLAS (0.3.21, Haswell kernels) rounds a row of
// sgemm differently with the call's M (M = 1 goes to sgemv; M 1-3, 4-11, 12+ give different bits
// for the same row), so the logits of a sequence depend on how many rows share its forward.
constexpr float kBlasTol = 1e-5f;
void check_same(const std::vector<Finished>& a, const std::vector<Finished>& b, float tol) {
    BOOST_REQUIRE_EQUAL(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
        BOOST_TEST_CONTEXT("request " << a[i].index) {
            BOOST_TEST(a[i].index == b[i].index);
            BOOST_TEST(a[i].tokens == b[i].tokens, boost::test_tools::per_element());
            BOOST_TEST((a[i].finish == b[i].finish));
            BOOST_REQUIRE_EQUAL(a[i].logprobs.size(), b[i].logprobs.size());
            BOOST_REQUIRE_EQUAL(a[i].prompt_logprobs.size(), b[i].prompt_logprobs.size());
            for (size_t k = 0; k < a[i].logprobs.size(); ++k)
                BOOST_TEST(std::abs(a[i].logprobs[k] - b[i].logprobs[k]) <= tol);
            for (size_t k = 0; k < a[i].prompt_logprobs.size(); ++k)
                BOOST_TEST(std::abs(a[i].prompt_logprobs[k] - b[i].prompt_logprobs[k]) <= tol);
        }
    }
}

const std::vector<double> kTemperatures = {0.0, 0.8};

}  // namespace

BOOST_AUTO_TEST_SUITE(infer)

BOOST_DATA_TEST_CASE(a_mixed_batch_yields_the_tokens_of_each_request_alone,
                     data::make(kTemperatures),
                     T) {
    const std::vector<Pending> reqs = requests();
    std::vector<Finished> batched = run(options(T, 32, 16), reqs), alone;
    for (const Pending& p : reqs)
        alone.push_back(run(options(T, 1, 16), {p})[0]);
    check_same(batched, alone, kBlasTol);
    int generated = 0;
    for (const Finished& f : batched) {
        const int64_t max_new = f.req.max_new_tokens >= 0 ? f.req.max_new_tokens : 12;
        BOOST_TEST(static_cast<int64_t>(f.tokens.size()) == max_new);
        generated += static_cast<int>(f.tokens.size());
    }
    BOOST_TEST(generated > 100);
}

BOOST_DATA_TEST_CASE(chunked_prefill_equals_unchunked, data::make(kTemperatures), T) {
    EngineOptions chunked = options(T, 4, 3), whole = options(T, 4, 64);
    chunked.prompt_logprobs = whole.prompt_logprobs = true;
    const std::vector<Pending> reqs = requests();
    std::vector<Finished> a = run(chunked, reqs), b = run(whole, reqs);
    check_same(a, b, 2e-5f);
    for (const Finished& f : a)
        BOOST_TEST(f.prompt_logprobs.size() == f.req.tokens.size() - 1);
}

BOOST_DATA_TEST_CASE(results_are_identical_across_max_seqs, data::make(kTemperatures), T) {
    const std::vector<Pending> reqs = requests();
    std::vector<Finished> one = run(options(T, 1, 16), reqs);
    check_same(run(options(T, 4, 16), reqs), one, kBlasTol);
    check_same(run(options(T, 32, 16), reqs), one, kBlasTol);
}

// inference.batch_invariant: every GEMM row through the same 8-row kernel call, so tokens AND
// logprobs are bit-identical across max_seqs 1, 4, 32 (a different prefill_chunk changes the KDA
// and attention algorithms themselves, so chunkings still agree only to rounding).
BOOST_DATA_TEST_CASE(batch_invariant_mode_is_bit_identical, data::make(kTemperatures), T) {
    struct Invariant {  // on for this test only, even if a check stops it early
        Invariant() { ops::set_batch_invariant(true); }
        ~Invariant() { ops::set_batch_invariant(false); }
    } invariant;
    const auto reqs = requests();
    const auto one = run(options(T, 1, 256), reqs);
    check_same(one, run(options(T, 4, 256), reqs), 0.0f);
    check_same(one, run(options(T, 32, 256), reqs), 0.0f);
}

BOOST_AUTO_TEST_CASE(eos_stops_a_sequence_and_is_its_last_token) {
    const std::vector<Pending> reqs = requests();
    EngineOptions o = options(0, 8, 16);
    std::vector<Finished> free_run = run(o, reqs);
    o.eos_id = free_run[0].tokens[2];  // request 0 samples it as its third token
    std::vector<Finished> stopped = run(o, reqs);
    BOOST_TEST((stopped[0].finish == runtime::Finish::stop));
    BOOST_TEST(stopped[0].tokens ==
                   std::vector<int64_t>(free_run[0].tokens.begin(), free_run[0].tokens.begin() + 3),
               boost::test_tools::per_element());
    for (const Finished& f : stopped) {  // every output ends at its first eos, if any
        auto eos = std::find(f.tokens.begin(), f.tokens.end(), o.eos_id);
        BOOST_TEST((eos == f.tokens.end() || eos + 1 == f.tokens.end()));
        BOOST_TEST((f.finish == runtime::Finish::stop) == (eos != f.tokens.end()));
    }
}

BOOST_AUTO_TEST_CASE(steps_respect_max_seqs_and_max_tokens_and_report_progress) {
    EngineOptions o = options(0, 5, 8);
    o.max_tokens = 12, o.progress_every_s = 1e-9;  // a progress call after every step
    size_t next = 0;
    const std::vector<Pending> reqs = requests();
    int64_t calls = 0, last_done = 0, zero_new = 0;
    runtime::EngineStats s = runtime::run_engine(
        tiny(),
        o,
        [&](Pending& p) { return next < reqs.size() ? (p = reqs[next++], true) : false; },
        [&](Finished&& f) { zero_new += f.tokens.empty(); },
        [&](const runtime::EngineStats& st, int64_t running) {
            ++calls;
            BOOST_TEST(running <= 5);
            BOOST_TEST(st.requests >= last_done);
            BOOST_TEST(st.rows <= st.steps * 12);  // every step within max_tokens
            last_done = st.requests;
        });
    BOOST_TEST(calls == s.steps);
    BOOST_TEST(s.requests == 24);
    BOOST_TEST(zero_new == 4);  // the requests with max_new_tokens 0: prompt only
    BOOST_TEST(s.seqs <= s.steps * 5);
}

// A request's own sampling settings (io::Request, vLLM's names) are the sampler's definition
// with those parameters: with a seed its draws are Philox(seed, stream 0, token index), i.e.
// those of the same request at index 0 of a run whose job.seed is that seed and whose deck
// samples with its settings; temperature 0 in a sampling deck is the greedy run.
BOOST_AUTO_TEST_CASE(per_request_sampling_follows_the_sampler) {
    Pending own = requests()[0];
    own.index = 5;
    own.req.max_new_tokens = 12;
    own.req.seed = 11, own.req.temperature = 0.8, own.req.top_k = 40, own.req.top_p = 0.9;
    const std::vector<Finished> got = run(options(0.0, 4, 64), {own});
    Pending plain = requests()[0];
    plain.index = 0;
    plain.req.max_new_tokens = 12;
    EngineOptions o = options(0.8, 4, 64);  // sampling {0.8, 40, 0.9}
    o.seed = 11;
    const std::vector<Finished> want = run(o, {plain});
    BOOST_REQUIRE(got.size() == 1u && want.size() == 1u);
    BOOST_TEST(got[0].tokens == want[0].tokens, boost::test_tools::per_element());
    const std::vector<Finished> greedy = run(options(0.0, 4, 64), {plain});
    BOOST_TEST(got[0].tokens != greedy[0].tokens);  // it sampled
    Pending cold = plain;
    cold.req.temperature = 0;
    BOOST_TEST(run(options(0.8, 4, 64), {cold})[0].tokens == greedy[0].tokens,
               boost::test_tools::per_element());
}

// Stops (runtime/engine.h), with each token's bytes one letter (token t is 'a' + t mod 26): a
// stop string of two letters from the middle of the greedy output ends it at the token that
// completes the string's first occurrence (spanning two tokens), text_bytes cuts before it, and
// of two stop strings the earlier match wins; a stop token id ends it at its first occurrence,
// kept as the last token; either way the tokens before equal the unstopped run's.
BOOST_AUTO_TEST_CASE(stop_strings_and_stop_tokens_end_a_sequence) {
    std::vector<std::string> letters(256);
    for (int t = 0; t < 256; ++t)
        letters[t] = std::string(1, static_cast<char>('a' + t % 26));
    EngineOptions o = options(0.0, 4, 64);
    o.token_bytes = [&](int64_t t) -> const std::string& { return letters[t]; };
    Pending plain = requests()[1];
    plain.req.max_new_tokens = 12;
    const std::vector<int64_t> free = run(o, {plain})[0].tokens;
    BOOST_REQUIRE(free.size() == 12u);
    std::string text;
    for (int64_t t : free)
        text += letters[t];
    const std::string stop = text.substr(4, 2), late = text.substr(9, 3);
    const size_t at = text.find(stop);  // the first occurrence: at ≤ 4, completed at token at + 1
    BOOST_REQUIRE(text.find(late) + 3 > at + 2);  // the later stop completes later
    Pending p = plain;
    p.req.stop = {late, stop};
    const Finished f = run(o, {p})[0];
    BOOST_TEST((f.finish == runtime::Finish::stop));
    BOOST_TEST(f.stop_string == stop);
    BOOST_TEST(f.stop_token == -1);
    BOOST_TEST(f.text_bytes == static_cast<int64_t>(at));
    BOOST_TEST(f.tokens == std::vector<int64_t>(free.begin(), free.begin() + at + 2),
               boost::test_tools::per_element());
    // a stop token: the first occurrence of the 6th token's id
    p.req.stop = {};
    int64_t unseen = 3;
    while (std::find(free.begin(), free.end(), unseen) != free.end())
        ++unseen;
    p.req.stop_token_ids = {unseen, free[5]};
    const size_t first = std::find(free.begin(), free.end(), free[5]) - free.begin();
    const Finished g = run(o, {p})[0];
    BOOST_TEST((g.finish == runtime::Finish::stop));
    BOOST_TEST(g.stop_token == free[5]);
    BOOST_TEST(g.text_bytes == -1);
    BOOST_TEST(g.tokens == std::vector<int64_t>(free.begin(), free.begin() + first + 1),
               boost::test_tools::per_element());
    // a stop string that never occurs: the unstopped run, by length
    p.req.stop_token_ids = {};
    p.req.stop = {"zzzzzzzzzzzzz"};
    const Finished h = run(o, {p})[0];
    BOOST_TEST((h.finish == runtime::Finish::length));
    BOOST_TEST(h.tokens == free, boost::test_tools::per_element());
    BOOST_TEST(h.stop_string.empty());
}

BOOST_AUTO_TEST_SUITE_END()

namespace {

const std::string kDeck = "tests/decks/infer/deck.yaml";
const std::string kDir = "tests/decks/infer/";

// Every /requests dataset of a results.h5 but the logprobs, as text, for whole-file comparison.
std::map<std::string, std::string> requests_of(const std::string& path) {
    io::H5Reader h5(path);
    std::map<std::string, std::string> out;
    for (const char* name : {"id", "finish_reason", "adapter"}) {
        std::string s;
        for (const std::string& v : h5.strings(std::string("/requests/") + name))
            s += v + "\n";
        out[name] = s;
    }
    for (const char* name :
         {"index", "line", "prompt_len", "output_offsets", "output_tokens", "done"}) {
        std::string s;
        for (int64_t v : h5.ints(std::string("/requests/") + name))
            s += std::to_string(v) + " ";
        out[name] = s;
    }
    return out;
}

// Every request's tokens (exactly) and logprobs (to kBlasTol) of two results.h5 files.
void expect_same_results(const std::string& got, const std::string& want) {
    auto a = requests_of(got), b = requests_of(want);
    for (const auto& [name, text] : b)
        BOOST_TEST(a[name] == text, name);
    const std::vector<float> lp = io::H5Reader(got).floats("/requests/output_logprobs");
    const std::vector<float> lp_ref = io::H5Reader(want).floats("/requests/output_logprobs");
    BOOST_REQUIRE_EQUAL(lp.size(), lp_ref.size());
    for (size_t i = 0; i < lp.size(); ++i)
        BOOST_TEST(std::abs(lp[i] - lp_ref[i]) <= kBlasTol);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(infer_job)

BOOST_AUTO_TEST_CASE(kill_9_mid_job_then_rerun_equals_an_uninterrupted_run) {
    fs::remove_all(kDir + "out"), fs::remove_all(kDir + "ref");
    auto ref = testing::run_hymoe(kDeck + " --set job.output=ref");
    BOOST_REQUIRE_MESSAGE(ref.code == 0, ref.err);

    const char* bin = std::getenv("HYMOE_BIN");
    const std::string exe = bin ? bin : "build/hymoe", pidfile = kDir + "pid";
    std::system((exe + " " + kDeck + " >/dev/null 2>&1 & echo $! >" + pidfile).c_str());
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const pid_t pid = std::stoi(testing::read_text(pidfile));
    const std::string first_segment = kDir + "out/results.parts/seg-000000.h5";
    for (int i = 0; i < 2000 && !fs::exists(first_segment); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    ::kill(pid, SIGKILL);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    fs::remove(pidfile);
    BOOST_REQUIRE(fs::exists(first_segment));
    BOOST_REQUIRE_MESSAGE(!fs::exists(kDir + "out/results.h5"), "the job ended before the kill");

    auto rerun = testing::run_hymoe(kDeck);
    BOOST_REQUIRE_MESSAGE(rerun.code == 0, rerun.err);
    BOOST_TEST(rerun.out.find("resuming: ") != std::string::npos, rerun.out);
    BOOST_TEST(rerun.out.find("done: 320 requests") != std::string::npos, rerun.out);
    BOOST_TEST(rerun.out.find(" 0 resumed") == std::string::npos);
    BOOST_TEST(!fs::exists(kDir + "out/results.parts"));
    // logprobs: the resumed requests ran in other batches (kBlasTol above)
    expect_same_results(kDir + "out/results.h5", kDir + "ref/results.h5");
    fs::remove_all(kDir + "out"), fs::remove_all(kDir + "ref");
}

// SIGUSR1 (Slurm's warning before the wall time) to mpirun, which forwards it to both pipeline
// stages: they agree to stop at a step boundary (the second stage takes the activations already
// sent to it), the job flushes what has finished, exits 75 and names the signal; the rerun
// resumes and ends with the uninterrupted run's results.
BOOST_AUTO_TEST_CASE(sigusr1_on_two_stages_stops_with_75_then_resumes) {
    fs::remove_all(kDir + "out"), fs::remove_all(kDir + "ref");
    auto ref = testing::run_hymoe(kDeck + " --set job.output=ref");
    BOOST_REQUIRE_MESSAGE(ref.code == 0, ref.err);
    const char* bin = std::getenv("HYMOE_BIN");
    const std::string exe = bin ? bin : "build/hymoe", pidfile = kDir + "pid", rcfile = kDir + "rc";
    fs::remove(rcfile);
    std::system(("(mpirun -q -np 2 " + exe + " " + kDeck + " --set parallel.pp=2 >" + kDir +
                 "stdout 2>&1 & echo $! >" + pidfile + "; wait $!; echo $? >" + rcfile + ") &")
                    .c_str());
    const std::string first_segment = kDir + "out/results.parts/seg-000000.h5";
    for (int i = 0; i < 4000 && !fs::exists(first_segment); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    BOOST_REQUIRE(fs::exists(first_segment));
    ::kill(std::stoi(testing::read_text(pidfile)), SIGUSR1);
    for (int i = 0; i < 3000 && !fs::exists(rcfile); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    BOOST_REQUIRE(fs::exists(rcfile));
    const std::string out = testing::read_text(kDir + "stdout");
    fs::remove(pidfile), fs::remove(kDir + "stdout");
    BOOST_REQUIRE_MESSAGE(!fs::exists(kDir + "out/results.h5"), "the job ended before the signal");
    BOOST_TEST(std::stoi(testing::read_text(rcfile)) == 75, out);
    BOOST_TEST(out.find("stopped by SIGUSR1") != std::string::npos, out);

    auto rerun = testing::run_hymoe(kDeck + " --set parallel.pp=2", 2);
    BOOST_REQUIRE_MESSAGE(rerun.code == 0, rerun.err);
    BOOST_TEST(rerun.out.find("resuming: ") != std::string::npos, rerun.out);
    expect_same_results(kDir + "out/results.h5", kDir + "ref/results.h5");
    fs::remove_all(kDir + "out"), fs::remove_all(kDir + "ref"), fs::remove(rcfile);
}

// A KV pool of 5 pages of 16 tokens cannot hold the running set: sequences are preempted and
// restarted, and every request still ends with the tokens of an unconstrained run. A pool that
// cannot hold one request is a deck error naming the key.
BOOST_AUTO_TEST_CASE(page_exhaustion_preempts_and_still_completes) {
    fs::remove_all(kDir + "out");
    auto ref = testing::run_hymoe(kDeck + " --set job.output=out/ref");
    BOOST_REQUIRE_MESSAGE(ref.code == 0, ref.err);
    const std::string small =
        " --set inference.kv_cache.page_tokens=16 --set inference.kv_cache.pages=";
    auto r = testing::run_hymoe(kDeck + " --set job.output=out/small" + small + "5");
    BOOST_REQUIRE_MESSAGE(r.code == 0, r.err);
    BOOST_TEST(r.out.find("at most 5 of 5 pages") != std::string::npos, r.out);
    BOOST_TEST(r.out.find(" 0 preemptions") == std::string::npos, r.out);
    expect_same_results(kDir + "out/small/results.h5", kDir + "out/ref/results.h5");
    auto tiny = testing::run_hymoe(kDeck + " --set job.output=out/tiny" + small + "1");
    BOOST_TEST(tiny.code == 2);
    BOOST_TEST(tiny.err.find("inference.kv_cache.pages: 1 pages of 16 tokens per pipeline lane "
                             "cannot hold request") != std::string::npos,
               tiny.err);
    fs::remove_all(kDir + "out");
}

// The same requests as an HDF5 token dataset (/tokens flat, /offsets, /max_new_tokens, written
// by h5py from the JSONL) give the JSONL run's tokens and logprobs; offsets that run backwards
// are a bad request naming the file and the row.
BOOST_AUTO_TEST_CASE(hdf5_token_dataset_equals_the_jsonl) {
    fs::remove_all(kDir + "out");
    auto ref = testing::run_hymoe(kDeck + " --set job.output=out/ref");
    BOOST_REQUIRE_MESSAGE(ref.code == 0, ref.err);
    const std::string script =
        "import h5py, json, numpy as np, sys\n"
        "rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]\n"
        "toks = [r['tokens'] for r in rows]\n"
        "off = np.cumsum([0] + [len(t) for t in toks])\n"
        "with h5py.File(sys.argv[2], 'w') as f:\n"
        "    f['tokens'] = np.array(sum(toks, []), dtype=np.int32)\n"
        "    f['offsets'] = off.astype(np.int64)\n"
        "    f['max_new_tokens'] = np.array([r.get('max_new_tokens', 16) for r in rows])\n"
        "with h5py.File(sys.argv[3], 'w') as f:\n"
        "    f['tokens'] = np.arange(10, dtype=np.int64)\n"
        "    f['offsets'] = np.array([0, 4, 2, 10], dtype=np.int64)\n";
    std::ofstream(kDir + "to_h5.py") << script;
    const std::string data = "inputs/data/quickstart.jsonl";  // the deck's dataset
    BOOST_REQUIRE(std::system(("/usr/bin/python3 " + kDir + "to_h5.py " + data + " " + kDir +
                               "requests.h5 " + kDir + "bad.h5")
                                  .c_str()) == 0);
    auto r = testing::run_hymoe(
        kDeck + " --set job.output=out/h5 --set inference.dataset=" + "requests.h5");
    BOOST_REQUIRE_MESSAGE(r.code == 0, r.err);
    const std::string got = kDir + "out/h5/results.h5", want = kDir + "out/ref/results.h5";
    for (const char* name : {"/requests/output_tokens", "/requests/prompt_len", "/requests/index"})
        BOOST_TEST(io::H5Reader(got).ints(name) == io::H5Reader(want).ints(name), name);
    const std::vector<float> a = io::H5Reader(got).floats("/requests/output_logprobs");
    const std::vector<float> b = io::H5Reader(want).floats("/requests/output_logprobs");
    BOOST_REQUIRE_EQUAL(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i)
        BOOST_TEST(std::abs(a[i] - b[i]) <= kBlasTol);
    auto bad =
        testing::run_hymoe(kDeck + " --set job.output=out/bad --set inference.dataset=bad.h5");
    BOOST_TEST(bad.code == 3);
    BOOST_TEST(
        bad.err.find("bad.h5:2: offsets [4, 2) are not a range of /tokens") != std::string::npos,
        bad.err);
    fs::remove_all(kDir + "out");
    for (const char* f : {"to_h5.py", "requests.h5", "bad.h5"})
        fs::remove(kDir + f);
}

// inference.logprobs = 4 with greedy decoding: every output token gets its 4 most likely tokens
// with their logprobs, most likely first; the first is the emitted token with its logprob.
BOOST_AUTO_TEST_CASE(top_logprobs_rank_the_emitted_token_first) {
    fs::remove_all(kDir + "out");
    auto r = testing::run_hymoe(
        kDeck + " --set inference.logprobs=4 --set inference.sampling.temperature=0");
    BOOST_REQUIRE_MESSAGE(r.code == 0, r.err);
    io::H5Reader h5(kDir + "out/results.h5");
    const std::vector<int64_t> out = h5.ints("/requests/output_tokens");
    const std::vector<float> lp = h5.floats("/requests/output_logprobs");
    BOOST_REQUIRE((h5.shape("/requests/top_tokens") == Shape{static_cast<int64_t>(out.size()), 4}));
    const std::vector<int64_t> top = h5.ints("/requests/top_tokens");
    const std::vector<float> top_lp = h5.floats("/requests/top_logprobs");
    for (size_t i = 0; i < out.size(); ++i) {
        BOOST_TEST(top[4 * i] == out[i]);
        BOOST_TEST(top_lp[4 * i] == lp[i]);
        for (size_t j = 1; j < 4; ++j)
            BOOST_TEST(top_lp[4 * i + j] <= top_lp[4 * i + j - 1]);
    }
    fs::remove_all(kDir + "out");
}

// job.max_hours: a budget already spent stops at the first step boundary with 75.
BOOST_AUTO_TEST_CASE(max_hours_stops_cleanly_with_75) {
    fs::remove_all(kDir + "out");
    auto r = testing::run_hymoe(kDeck + " --set job.max_hours=1e-9");
    BOOST_TEST(r.code == 75, r.err);
    BOOST_TEST(r.out.find("stopped by job.max_hours") != std::string::npos, r.out);
    BOOST_TEST(fs::exists(kDir + "out/results.parts"));
    BOOST_TEST(!fs::exists(kDir + "out/results.h5"));
    fs::remove_all(kDir + "out");
}

// Array jobs: three shards (index mod 3), each its own folder, gathered into one results.h5 equal
// to the single run's; a shard given twice, or one missing, is refused.
// The shards batch other requests together than the single run does, so a row's products may
// round differently (the decode GEMV serves steps of up to 4 rows, sgemm larger ones) and a
// sampled token near a tie may flip: the equality holds under batch_invariant, as Slurm's array
// drill runs it.
BOOST_AUTO_TEST_CASE(shards_gather_into_the_single_run) {
    fs::remove_all(kDir + "out");
    const std::string invariant = " --set inference.batch_invariant=true";
    auto ref = testing::run_hymoe(kDeck + invariant + " --set job.output=out/ref");
    BOOST_REQUIRE_MESSAGE(ref.code == 0, ref.err);
    std::string dirs;
    for (int i = 0; i < 3; ++i) {
        const std::string dir = "out/shard-" + std::to_string(i);
        auto r = testing::run_hymoe(
            kDeck + invariant + " --set job.output=" + dir +
            " --set inference.shards=3 --set inference.shard=" + std::to_string(i));
        BOOST_REQUIRE_MESSAGE(r.code == 0, r.err);
        dirs += " " + kDir + dir;
    }
    auto g = testing::run_hymoe("--gather " + kDir + "out/all" + dirs);
    BOOST_REQUIRE_MESSAGE(g.code == 0, g.err);
    expect_same_results(kDir + "out/all/results.h5", kDir + "out/ref/results.h5");
    BOOST_TEST(io::H5Reader(kDir + "out/all/results.h5").strings("/meta/gathered_from").size() ==
               3u);
    auto twice = testing::run_hymoe("--gather " + kDir + "out/bad " + kDir + "out/shard-0 " + kDir +
                                    "out/shard-0 " + kDir + "out/shard-1");
    BOOST_TEST(twice.code == 3);
    BOOST_TEST(twice.err.find("overlapping shards") != std::string::npos, twice.err);
    auto missing = testing::run_hymoe("--gather " + kDir + "out/bad " + kDir + "out/shard-0 " +
                                      kDir + "out/shard-2");
    BOOST_TEST(missing.code == 3);
    BOOST_TEST(missing.err.find("shard folders were given") != std::string::npos, missing.err);
    fs::remove_all(kDir + "out");
}

BOOST_AUTO_TEST_CASE(h5py_reads_the_results_schema) {
    fs::remove_all(kDir + "out");
    auto r = testing::run_hymoe(kDeck + " --set inference.prompt_logprobs=true");
    BOOST_REQUIRE_MESSAGE(r.code == 0, r.err);
    const std::string script =
        "import h5py, sys\n"
        "f = h5py.File(sys.argv[1], 'r'); q = f['requests']; n = len(q['id'])\n"
        "assert n == 320 and q['done'][:].all()\n"
        "for k in ['index', 'line', 'prompt_len', 'finish_reason', 'adapter', 'greedy_token',\n"
        "          'greedy_logprob']:\n"
        "    assert q[k].shape == (n,), k\n"
        "o = q['output_offsets'][:]; assert o.shape == (n + 1,) and o[0] == 0\n"
        "assert o[-1] == len(q['output_tokens']) == len(q['output_logprobs'])\n"
        "p = q['logprob_offsets'][:]; assert p[-1] == len(q['prompt_logprobs'])\n"
        "assert (p[1:] - p[:-1] == q['prompt_len'][:] - 1).all()\n"
        "assert set(q['finish_reason'].asstr()[:]) <= {'stop', 'length'}\n"
        "assert q['id'].asstr()[0] == 'qs-0000' and (q['output_logprobs'][:] < 0).all()\n"
        "assert f['meta/deck_sha256'][()]\n"
        "print('schema ok', n)\n";
    std::ofstream(kDir + "check.py") << script;
    const int rc = std::system(("/usr/bin/python3 " + kDir + "check.py " + kDir +
                                "out/results.h5 >" + kDir + "check.txt 2>&1")
                                   .c_str());
    BOOST_TEST(rc == 0, testing::read_text(kDir + "check.txt"));
    fs::remove(kDir + "check.py"), fs::remove(kDir + "check.txt");
    fs::remove_all(kDir + "out");
}

BOOST_AUTO_TEST_SUITE_END()
