// Prefix caching (inference.prefix_cache, runtime/prefix_cache.h) in the engine and through the
// binary: prompts sharing a long prefix give bit for bit the tokens, logprobs and finish reasons of
// an uncached run (inference.batch_invariant), greedy and sampled, at page and chunk sizes that
// do and do not divide the shared prefix, and under a page pool small enough to preempt and evict;
// the restored tokens are counted; and the binary's results.h5 on inputs/data/shared_prefix.jsonl
// (a 512-token system prompt) equals the uncached job's, with the hit-rate line in its log.
#include <filesystem>

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
using runtime::EngineStats;
using runtime::Finished;
using runtime::Pending;

namespace {

const model::Model& tiny() {
    static model::Model m = [] {
        model::Model x = model::make_model(model::preset_config("tiny"));
        model::init_model_random(x, 13);
        return x;
    }();
    return m;
}

// 14 requests: 10 open with a shared prefix of `shared` tokens and go on with 1..60 of their own,
// 2 are the prefix plus one token, 2 share nothing.
std::vector<Pending> requests(int64_t shared) {
    Philox rng(27, 0, 0);
    std::vector<int64_t> prefix;
    for (int64_t t = 0; t < shared; ++t)
        prefix.push_back(3 + rng.next_u32() % 253);
    std::vector<Pending> reqs;
    for (int i = 0; i < 14; ++i) {
        Pending p;
        p.index = i;
        p.req.id = "r" + std::to_string(i);
        p.req.line = i + 1;
        if (i < 12)
            p.req.tokens = prefix;
        const int64_t own = i < 10 ? 1 + rng.next_u32() % 60 : i < 12 ? 1 : 100;
        for (int64_t t = 0; t < own; ++t)
            p.req.tokens.push_back(3 + rng.next_u32() % 253);
        reqs.push_back(p);
    }
    return reqs;
}

std::vector<Finished> run(const EngineOptions& o,
                          const std::vector<Pending>& reqs,
                          EngineStats& s) {
    size_t next = 0;
    std::vector<Finished> out;
    s = runtime::run_engine(
        tiny(),
        o,
        [&](Pending& p) { return next < reqs.size() ? (p = reqs[next++], true) : false; },
        [&](Finished&& f) { out.push_back(std::move(f)); });
    std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.index < b.index; });
    return out;
}

EngineOptions options(double temperature, int page_tokens, int prefill_chunk) {
    EngineOptions o;
    o.max_seqs = 4, o.max_tokens = 2048, o.prefill_chunk = prefill_chunk;
    o.page_tokens = page_tokens;
    o.max_new_tokens = 6, o.seed = 3, o.progress_every_s = 0;
    o.sampling = {temperature, temperature > 0 ? 40 : 0, temperature > 0 ? 0.9 : 1.0};
    return o;
}

void check_identical(const std::vector<Finished>& a, const std::vector<Finished>& b) {
    BOOST_REQUIRE_EQUAL(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
        BOOST_TEST_CONTEXT("request " << a[i].index) {
            BOOST_TEST(a[i].index == b[i].index);
            BOOST_TEST(a[i].tokens == b[i].tokens, boost::test_tools::per_element());
            BOOST_TEST(a[i].logprobs == b[i].logprobs, boost::test_tools::per_element());
            BOOST_TEST(a[i].greedy_token == b[i].greedy_token);
            BOOST_TEST(a[i].greedy_logprob == b[i].greedy_logprob);
            BOOST_TEST((a[i].finish == b[i].finish));
        }
    }
}

struct Invariant {  // inference.batch_invariant for one test, even if a check stops it early
    Invariant() { ops::set_batch_invariant(true); }
    ~Invariant() { ops::set_batch_invariant(false); }
};

// (page_tokens, prefill_chunk, shared prefix): boundaries at 256 inside a call; a chunk of 96
// that does not divide the prefix (the cache stops at 480, a call boundary); pages of 64 with
// the prefix at 320 (the cache stops at 256)
struct CacheShape {
    int page, chunk;
    int64_t shared, want_restored;
};
const std::vector<CacheShape> kShapes = {
    {64, 2048, 512, 512}, {16, 96, 512, 480}, {64, 2048, 320, 256}};

}  // namespace

BOOST_AUTO_TEST_SUITE(prefix_cache_job)

BOOST_DATA_TEST_CASE(cached_prefixes_give_the_uncached_results_bit_for_bit,
                     data::make({0.0, 0.8}) * data::xrange(3),
                     T,
                     k) {
    const Invariant invariant;
    const CacheShape sh = kShapes[static_cast<size_t>(k)];
    const std::vector<Pending> reqs = requests(sh.shared);
    EngineOptions off = options(T, sh.page, sh.chunk), on = off;
    on.prefix_cache_bytes = int64_t{1} << 30;
    EngineStats s_off, s_on;
    const std::vector<Finished> a = run(off, reqs, s_off), b = run(on, reqs, s_on);
    check_identical(a, b);
    int64_t prompt = 0;
    for (const Pending& p : reqs)
        prompt += static_cast<int64_t>(p.req.tokens.size());
    BOOST_TEST(s_off.prompt_tokens == prompt);
    BOOST_TEST(s_off.cached_tokens == 0);
    // the first 4 requests are admitted in one step, before anything is stored: the first is
    // prefilled whole, the other 3 stop at the shared prefix to store it (one entry is kept);
    // the next 6 restore it, and so does the second prompt of prefix + 1 token, whose boundary
    // lies one page or more earlier (its last call must keep 2 tokens), from the first's entry
    BOOST_TEST(s_on.cached_tokens + s_on.prompt_tokens == prompt);
    BOOST_TEST(s_on.cache_lookups == 14);
    BOOST_TEST(s_on.cache_hits >= 7);
    BOOST_TEST(s_on.cached_tokens >= 6 * sh.want_restored);
    BOOST_TEST(s_on.cache_stored >= 1);
    BOOST_TEST(s_on.cache_evicted == 0);
}

// 40 or 64 pages of 16 tokens per lane, where four 560-token prompts need 140: sequences are
// preempted and cache entries evicted, and the results stay those of the uncached run with the
// same pool. (At 64 pages a sequence waiting for room once kept its restored prefix's pages, and
// with the entry they starved the running sequence: no step could run.)
BOOST_DATA_TEST_CASE(preemption_and_eviction_keep_the_results_and_the_pool_right,
                     data::make({40, 64}),
                     pages) {
    const Invariant invariant;
    const std::vector<Pending> reqs = requests(512);
    EngineOptions off = options(0.0, 16, 96), on = off;
    off.kv_pages = on.kv_pages = pages;
    on.prefix_cache_bytes = int64_t{1} << 30;
    EngineStats s_off, s_on;
    const std::vector<Finished> a = run(off, reqs, s_off), b = run(on, reqs, s_on);
    check_identical(a, b);
    BOOST_TEST(s_on.preemptions > 0);
    BOOST_TEST(s_on.cache_hits > 0);
    BOOST_TEST(s_on.cache_evicted > 0);
    BOOST_TEST(s_on.peak_pages <= pages);
    int64_t prompt = 0;
    for (const Pending& p : reqs)
        prompt += static_cast<int64_t>(p.req.tokens.size());
    BOOST_TEST(s_on.cached_tokens + s_on.prompt_tokens == prompt);  // preempted work not counted
    BOOST_TEST(s_on.cache_pages <= pages);
}

// The binary on the 32 requests of inputs/data/shared_prefix.jsonl: the cached job's results.h5
// equals the uncached job's in every token and logprob; its log gives the hit rate.
BOOST_AUTO_TEST_CASE(the_job_writes_the_uncached_results_and_logs_the_hit_rate) {
    const std::string base = "tests/decks/prefix/deck.yaml --set job.output=out/";
    const fs::path out = fs::path("tests/decks/prefix");
    fs::remove_all(out / "out");

    const auto on = testing::run_hymoe(base + "on --set inference.prefix_cache.enabled=true", 1);
    BOOST_REQUIRE_EQUAL(on.code, 0);
    const auto off = testing::run_hymoe(base + "off", 1);
    BOOST_REQUIRE_EQUAL(off.code, 0);
    io::H5Reader a((out / "out/on/results.h5").string()), b((out / "out/off/results.h5").string());
    for (const char* name :
         {"/requests/index", "/requests/output_tokens", "/requests/output_offsets"})
        BOOST_TEST(a.ints(name) == b.ints(name), boost::test_tools::per_element());
    BOOST_TEST(a.floats("/requests/output_logprobs") == b.floats("/requests/output_logprobs"),
               boost::test_tools::per_element());
    BOOST_TEST(a.ints("/requests/index").size() == 32u);
    const std::string log = testing::read_text((out / "out/on/log").string());
    // 29 of the 32 restore the 512-token system prompt (the first 4 are admitted together)
    BOOST_TEST(log.find("prefix cache: 17480 prompt tokens, 2632 prefilled, 14848 restored (hit "
                        "rate 84.9%); 29 of 32 requests hit") != std::string::npos,
               log);
    BOOST_TEST(testing::read_text((out / "out/off/log").string()).find("prefix cache:") ==
               std::string::npos);
    fs::remove_all(out / "out");
}

BOOST_AUTO_TEST_SUITE_END()
