// make bench: prefix caching (inference.prefix_cache, runtime/prefix_cache.h) against the same
// engine run without it, measured in the same process. Reports, asserts nothing; no MPI. The
// requests are those of inputs/data/shared_prefix.jsonl's kind: 32 prompts of one 512-token
// system prompt and 8..72 tokens of their own (Philox seed 27), each generating one token, so the
// wall time is the prefill's; batch_invariant on (the mode in which the results are bit-identical)
// and max_seqs 4, max_tokens = prefill_chunk = 2048, pages of 64. Per model (the tiny preset,
// then mid when `mid` is the argument: minutes on 2 cores), random weights (seed 1):
//   prompt tokens requested, prefilled and restored (the hit rate), with the cache and without
//   the wall time of each run (best of 2) and the speed-up, uncached / cached
//   whether every output token and logprob is bit-identical
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "hymoe/backend/ops.h"
#include "hymoe/core/rng.h"
#include "hymoe/core/timer.h"
#include "hymoe/model/model.h"
#include "hymoe/runtime/engine.h"

namespace {

using namespace hymoe;

constexpr int kRequests = 32;
constexpr int64_t kSystem = 512;

std::vector<runtime::Pending> requests(int64_t vocab) {
    Philox rng(27, 0, 0);
    std::vector<int64_t> system;
    for (int64_t t = 0; t < kSystem; ++t)
        system.push_back(3 + rng.next_u32() % (vocab - 3));
    std::vector<runtime::Pending> reqs;
    for (int i = 0; i < kRequests; ++i) {
        runtime::Pending p;
        p.index = i;
        p.req.id = "s" + std::to_string(i);
        p.req.tokens = system;
        const int64_t own = 8 + rng.next_u32() % 65;
        for (int64_t t = 0; t < own; ++t)
            p.req.tokens.push_back(3 + rng.next_u32() % (vocab - 3));
        reqs.push_back(p);
    }
    return reqs;
}

struct Result {
    runtime::EngineStats stats;
    std::vector<runtime::Finished> out;
    double seconds = 1e30;
};

Result run(const model::Model& m, const std::vector<runtime::Pending>& reqs, bool cache) {
    runtime::EngineOptions o;
    o.max_seqs = 4, o.max_tokens = 2048, o.prefill_chunk = 2048, o.page_tokens = 64;
    o.max_new_tokens = 1, o.progress_every_s = 0;
    o.prefix_cache_bytes = cache ? int64_t{1} << 30 : 0;
    Result r;
    for (int rep = 0; rep < 2; ++rep) {
        size_t next = 0;
        std::vector<runtime::Finished> out;
        const double t0 = wall_seconds();
        r.stats = runtime::run_engine(
            m,
            o,
            [&](runtime::Pending& p) {
                return next < reqs.size() ? (p = reqs[next++], true) : false;
            },
            [&](runtime::Finished&& f) { out.push_back(std::move(f)); });
        r.seconds = std::min(r.seconds, wall_seconds() - t0);
        std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.index < b.index; });
        r.out = std::move(out);
    }
    return r;
}

bool identical(const Result& a, const Result& b) {
    if (a.out.size() != b.out.size())
        return false;
    for (size_t i = 0; i < a.out.size(); ++i)
        if (a.out[i].tokens != b.out[i].tokens || a.out[i].logprobs != b.out[i].logprobs)
            return false;
    return true;
}

void bench(const std::string& preset) {
    model::Model m = model::make_model(model::preset_config(preset));
    model::init_model_random(m, 1);
    const std::vector<runtime::Pending> reqs = requests(m.cfg.vocab_size);
    const Result off = run(m, reqs, false), on = run(m, reqs, true);
    const int64_t requested = off.stats.prompt_tokens;
    std::printf("%s: %d requests, %lld prompt tokens (a %lld-token system prompt each)\n",
                preset.c_str(),
                kRequests,
                static_cast<long long>(requested),
                static_cast<long long>(kSystem));
    std::printf(
        "  prefilled: %lld without the cache, %lld with it (%lld restored, hit rate %.1f%%, "
        "%lld of %lld requests hit)\n",
        static_cast<long long>(off.stats.prompt_tokens),
        static_cast<long long>(on.stats.prompt_tokens),
        static_cast<long long>(on.stats.cached_tokens),
        100.0 * static_cast<double>(on.stats.cached_tokens) / static_cast<double>(requested),
        static_cast<long long>(on.stats.cache_hits),
        static_cast<long long>(on.stats.cache_lookups));
    std::printf(
        "  prefill wall (best of 2): %.3f s without, %.3f s with: speed-up %.2fx "
        "(tokens prefilled %.2fx fewer)\n",
        off.seconds,
        on.seconds,
        off.seconds / on.seconds,
        static_cast<double>(off.stats.prompt_tokens) /
            static_cast<double>(std::max<int64_t>(on.stats.prompt_tokens, 1)));
    std::printf("  outputs bit-identical: %s\n", identical(off, on) ? "yes" : "NO");
    std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
    ops::set_batch_invariant(true);
    bench("tiny");
    if (argc > 1 && std::strcmp(argv[1], "mid") == 0)
        bench("mid");
    return 0;
}
