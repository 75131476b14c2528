// make bench: KV offload to a spill file (inference.kv_cache.offload: file, runtime/kv_spill.h)
// against pages in memory, as ratios measured in the same run. Reports, asserts nothing; one
// process, no MPI. The model: the tiny preset with all 8 layers DSA (so a step's cache is 8
// layers and the spill tier keeps 2 of them in memory), random weights (seed 1234); 8 sequences
// of 2048-token prompts (prefilled in chunks of 256), then 32 decode steps of all 8: a context
// that does not fit the tier's resident budget. Figures:
//   decode tokens/s with the file tier and in memory, and their ratio
//   KV bytes in memory at most: the tier's two layer slots against all the pages
//   the spill file's read rate (bytes fetched / the helper thread's fetch seconds) against a
//   plain sequential read (pread, 1 MiB at a time) of a file of the same size in the same folder
//   (both mostly from the page cache: the file is as hot as the kernel keeps it)
// HYMOE_BENCH_DIR: the folder of the spill file (default /tmp).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fcntl.h>
#include <memory>
#include <string>
#include <unistd.h>
#include <vector>

#include "hymoe/core/rng.h"
#include "hymoe/core/timer.h"
#include "hymoe/model/kv_cache.h"
#include "hymoe/model/model.h"
#include "hymoe/model/model_on.h"
#include "hymoe/runtime/kv_spill.h"

namespace {

namespace model = hymoe::model;
using hymoe::wall_seconds;

constexpr int64_t kSeqs = 8, kPrompt = 2048, kChunk = 256, kDecode = 32;
constexpr int kPageTokens = 64;

struct Run {
    double decode_seconds = 0;
    int64_t resident_bytes = 0, page_bytes = 0;
    hymoe::runtime::SpillStats spill;
};

// The prompts prefilled, then kDecode decode steps (token ids from a counter: the cost does not
// depend on them), with the pool's rows where `store` puts them.
Run run(const model::Model& m, const model::KvStoreFactory& store) {
    const int64_t pages = kSeqs * ((kPrompt + kDecode + kPageTokens - 1) / kPageTokens);
    model::KvPool pool(m.local, m.shard, kPageTokens, pages, store);
    std::vector<model::SequenceState> st(kSeqs);
    std::vector<model::SequenceState*> ptrs;
    for (auto& s : st) {
        s = model::make_sequence_state(m);
        model::attach_kv_pool(m, s, pool);
        ptrs.push_back(&s);
    }
    const model::ModelViews views = model::host_views(m);
    auto step = [&](int64_t n) {  // n new tokens for every sequence
        model::SeqBatch batch{{0}, {}, {}};
        std::vector<int64_t> tokens;
        for (auto& s : st) {
            pool.reserve(s.pages, s.n_tokens + n);
            batch.pos0.push_back(s.n_tokens);
            for (int64_t i = 0; i < n; ++i)
                tokens.push_back((s.n_tokens + i) * 7 % m.cfg.vocab_size);
            batch.offsets.push_back(static_cast<int64_t>(tokens.size()));
        }
        hymoe::Buffer logits;
        model::forward({m, m.ctx, views}, tokens, batch, ptrs, logits, {model::Logits::last});
    };
    for (int64_t at = 0; at < kPrompt; at += kChunk)
        step(kChunk);
    Run r;
    const double t0 = wall_seconds();
    for (int64_t i = 0; i < kDecode; ++i)
        step(1);
    r.decode_seconds = wall_seconds() - t0;
    r.resident_bytes = pool.peak_resident_bytes();
    r.page_bytes = (pages - pool.free_pages()) * pool.page_bytes();
    for (auto& s : st)
        pool.release(s.pages);
    return r;
}

// GB/s of reading a `bytes` file in `dir` front to back with pread, 1 MiB at a time, best of 3
// (the file written first, so the page cache holds it as it holds the spill file).
double sequential_read_gbps(const std::string& dir, int64_t bytes) {
    std::string name = dir + "/hymoe-bench-XXXXXX";
    const int fd = ::mkstemp(name.data());
    if (fd < 0)
        return 0;
    ::unlink(name.c_str());
    std::vector<char> buf(size_t{1} << 20, 1);
    for (int64_t at = 0; at < bytes; at += static_cast<int64_t>(buf.size()))
        if (::pwrite(fd, buf.data(), buf.size(), at) < 0)
            return 0;
    double best = 1e30;
    for (int rep = 0; rep < 3; ++rep) {
        const double t0 = wall_seconds();
        for (int64_t at = 0; at < bytes; at += static_cast<int64_t>(buf.size()))
            if (::pread(fd, buf.data(), buf.size(), at) <= 0)
                break;
        best = std::min(best, wall_seconds() - t0);
    }
    ::close(fd);
    return static_cast<double>(bytes) / best / 1e9;
}

}  // namespace

int main() {
    const char* env = std::getenv("HYMOE_BENCH_DIR");
    const std::string dir = env != nullptr && *env != '\0' ? env : "/tmp";
    model::ModelConfig cfg = model::preset_config("tiny");
    const model::LayerSpec dsa = cfg.layers[3];  // the preset's gated DSA layer
    cfg.layers.assign(8, dsa);
    cfg.layers[0].ffn = model::Ffn::dense;
    model::Model m = model::make_model(cfg);
    model::init_model_random(m, 1234);

    const Run memory = run(m, {});
    hymoe::runtime::SpillStats spill;
    const Run file = run(m, [&](const model::KvLayout& l) {
        return std::make_unique<hymoe::runtime::SpillKvStore>(l, dir, "HYMOE_BENCH_DIR", &spill);
    });
    const double tokens = static_cast<double>(kSeqs * kDecode);
    const double spill_gbps =
        static_cast<double>(spill.bytes_read) / std::max(spill.read_seconds, 1e-9) / 1e9;
    const double seq_gbps = sequential_read_gbps(dir, std::max<int64_t>(file.page_bytes, 1 << 20));
    std::printf(
        "offload bench: tiny preset with 8 DSA layers, %lld sequences of %lld prompt "
        "tokens, %lld decode steps, pages of %d tokens, spill file in %s\n",
        static_cast<long long>(kSeqs),
        static_cast<long long>(kPrompt),
        static_cast<long long>(kDecode),
        kPageTokens,
        dir.c_str());
    std::printf(
        "  %-34s %9.1f tokens/s\n", "decode, pages in memory", tokens / memory.decode_seconds);
    std::printf("  %-34s %9.1f tokens/s  (%.3f of in memory)\n",
                "decode, offload file",
                tokens / file.decode_seconds,
                memory.decode_seconds / file.decode_seconds);
    std::printf(
        "  %-34s %9.2f MB        (%.3f of the pages' %.2f MB)\n",
        "KV in memory, offload file",
        static_cast<double>(file.resident_bytes) / 1e6,
        static_cast<double>(file.resident_bytes) / static_cast<double>(memory.resident_bytes),
        static_cast<double>(memory.resident_bytes) / 1e6);
    std::printf(
        "  %-34s %9.2f GB/s     (%.3f of a sequential read, %.2f GB/s; %.0f MB read, "
        "%.0f MB written)\n",
        "spill file fetches",
        spill_gbps,
        seq_gbps > 0 ? spill_gbps / seq_gbps : 0.0,
        seq_gbps,
        static_cast<double>(spill.bytes_read) / 1e6,
        static_cast<double>(spill.bytes_written) / 1e6);
    return 0;
}
