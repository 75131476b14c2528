// bench_model's shared pieces: a Span/Probe of what code cost (wall, GEMM FLOPs, CPU time,
// page faults), the references (sgemm peak, DRAM read rate) and the whole-model prefill and
// greedy decode of the `mid` figures.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <sys/resource.h>
#include <thread>
#include <vector>

#include <cblas.h>

#include "hymoe/backend/ops.h"
#include "hymoe/core/allocator.h"
#include "hymoe/core/error.h"
#include "hymoe/core/rng.h"
#include "hymoe/core/timer.h"
#include "hymoe/model/config.h"
#include "hymoe/model/kv_cache.h"
#include "hymoe/model/model.h"
#include "hymoe/model/model_on.h"

namespace hymoe_bench {

using hymoe::Buffer;
using hymoe::DType;
using hymoe::Philox;
using hymoe::wall_seconds;
namespace model = hymoe::model;
namespace ops = hymoe::ops;

constexpr uint64_t seed = 1234;

// What a piece of code cost: wall time, the GEMM counter's growth, and the process's CPU time and
// minor page faults (getrusage) over it.
struct Span {
    double wall = 0, gemm_flops = 0, gemm_seconds = 0, user = 0, sys = 0, faults = 0;
    double gemm_gflops() const { return gemm_flops / gemm_seconds / 1e9; }
};

class Probe {
public:
    Probe() : start_(now()) {}
    Span stop() const {
        Span end = now();
        return {end.wall - start_.wall,
                end.gemm_flops - start_.gemm_flops,
                end.gemm_seconds - start_.gemm_seconds,
                end.user - start_.user,
                end.sys - start_.sys,
                end.faults - start_.faults};
    }

private:
    static Span now() {
        rusage ru{};
        getrusage(RUSAGE_SELF, &ru);
        auto secs = [](const timeval& t) {
            return static_cast<double>(t.tv_sec) + 1e-6 * static_cast<double>(t.tv_usec);
        };
        return {wall_seconds(),
                ops::gemm_counter().flops,
                ops::gemm_counter().seconds,
                secs(ru.ru_utime),
                secs(ru.ru_stime),
                static_cast<double>(ru.ru_minflt)};
    }
    Span start_;
};

// Whether /proc/cpuinfo lists avx512f: OpenBLAS's AVX2 kernels (Haswell, Zen, or forced by
// OPENBLAS_CORETYPE) then leave about half of the fp32 FMA rate unused, which hymoe's own AVX-512
// GEMM (ops::gemm) takes back.
inline bool cpu_has_avx512() {
    std::ifstream in("/proc/cpuinfo");
    std::string line;
    while (std::getline(in, line))
        if (line.rfind("flags", 0) == 0)
            return line.find(" avx512f") != std::string::npos;
    return false;
}

inline int64_t env_int(const char* name, int64_t fallback) {
    const char* v = std::getenv(name);
    return v != nullptr && *v != '\0' ? std::atoll(v) : fallback;
}

// ---- references -------------------------------------------------------------------------------

// Best GFLOP/s of a 2048³ fp32 product through ops::gemm, after one warm-up call, with the
// kernels ops::set_weight_kernel(k) selects: automatic (hymoe's AVX-512 GEMM on such a CPU, the
// products the model runs) or portable (OpenBLAS sgemm).
class BlasPeak {
public:
    BlasPeak() : a_(DType::f32, {n, n}), b_(DType::f32, {n, n}), c_(DType::f32, {n, n}) {
        Philox rng(seed, 1, 0);
        rng.fill_normal(a_.ptr<float>(), static_cast<size_t>(n * n), 0.0f, 1.0f);
        rng.fill_normal(b_.ptr<float>(), static_cast<size_t>(n * n), 0.0f, 1.0f);
    }
    double gflops(ops::WeightKernel k) {
        ops::set_weight_kernel(k);
        double best = 1e30;
        for (int rep = 0; rep < 5; ++rep) {
            const double t0 = wall_seconds();
            ops::gemm(false,
                      false,
                      n,
                      n,
                      n,
                      1.0f,
                      a_.ptr<float>(),
                      n,
                      b_.ptr<float>(),
                      n,
                      0.0f,
                      c_.ptr<float>(),
                      n);
            if (rep > 0)
                best = std::min(best, wall_seconds() - t0);
        }
        ops::set_weight_kernel(ops::WeightKernel::automatic);
        return 2.0 * static_cast<double>(n * n * n) / best / 1e9;
    }

private:
    static constexpr int64_t n = 2048;
    Buffer a_, b_, c_;
};

// Best GB/s of reading `bytes` of zeros with `n_threads` threads, each over its own contiguous
// part: memchr for a byte that is not there, so glibc's SIMD loop streams the whole buffer at any
// compiler flags (an -O2 x86-64 loop of our own reads ~20% slower).
inline double read_gbps(const uint8_t* zeros, int64_t bytes, int n_threads) {
    std::vector<const void*> found(static_cast<size_t>(n_threads));
    auto part = [&](int i) {
        const int64_t begin = bytes * i / n_threads, end = bytes * (i + 1) / n_threads;
        found[static_cast<size_t>(i)] =
            std::memchr(zeros + begin, 1, static_cast<size_t>(end - begin));
    };
    double best = 1e30;
    for (int rep = 0; rep < 5; ++rep) {
        const double t0 = wall_seconds();
        std::vector<std::thread> pool;
        for (int i = 1; i < n_threads; ++i)
            pool.emplace_back(part, i);
        part(0);
        for (std::thread& t : pool)
            t.join();
        best = std::min(best, wall_seconds() - t0);
    }
    HYMOE_CHECK(std::count(found.begin(), found.end(), nullptr) == n_threads,
                "read_gbps: the buffer is not zeros");
    return static_cast<double>(bytes) / best / 1e9;
}

// ---- model figures ------------------------------------------------------------------------------

inline std::vector<model::SequenceState*> pointers(std::vector<model::SequenceState>& states) {
    std::vector<model::SequenceState*> ptrs;
    for (model::SequenceState& s : states)
        ptrs.push_back(&s);
    return ptrs;
}

// One packed batch of n_seq new sequences of len random tokens; states are made here.
inline Span prefill(const model::Model& m,
                    int64_t n_seq,
                    int64_t len,
                    std::vector<model::SequenceState>& states,
                    model::ForwardStats& stats) {
    const model::ModelConfig& cfg = m.cfg;
    model::SeqBatch batch;
    for (int64_t s = 0; s <= n_seq; ++s)
        batch.offsets.push_back(s * len);
    batch.pos0.assign(static_cast<size_t>(n_seq), 0);
    std::vector<int64_t> tokens(static_cast<size_t>(n_seq * len));
    Philox rng(seed, 2, 0);
    for (int64_t& t : tokens)
        t = 3 + static_cast<int64_t>(rng.next_u32() % static_cast<uint32_t>(cfg.vocab_size - 3));
    states.clear();
    for (int64_t s = 0; s < n_seq; ++s)
        states.push_back(model::make_sequence_state(m));
    Buffer logits;
    const model::ModelViews views = model::host_views(m);  // made once, outside the span
    Probe probe;
    stats = model::ForwardStats{};
    model::ForwardOptions options;
    options.logits = model::Logits::last;
    options.stats = &stats;
    model::forward({m, m.ctx, views}, tokens, batch, pointers(states), logits, options);
    return probe.stop();
}

// Greedy step-decode of every sequence, `steps` steps.
inline Span decode(const model::Model& m,
                   int64_t steps,
                   std::vector<model::SequenceState>& states) {
    const int64_t n_seq = static_cast<int64_t>(states.size()), V = m.cfg.vocab_size;
    std::vector<int64_t> tokens(static_cast<size_t>(n_seq), 3);
    Buffer logits;
    const model::ModelViews views = model::host_views(m);
    Probe probe;
    for (int64_t step = 0; step < steps; ++step) {
        model::SeqBatch batch;
        for (int64_t s = 0; s <= n_seq; ++s)
            batch.offsets.push_back(s);
        for (const model::SequenceState& s : states)
            batch.pos0.push_back(s.n_tokens);
        model::forward(
            {m, m.ctx, views}, tokens, batch, pointers(states), logits, {model::Logits::last});
        for (int64_t s = 0; s < n_seq; ++s) {
            const float* row = logits.ptr<float>() + s * V;
            tokens[static_cast<size_t>(s)] = std::max_element(row, row + V) - row;
        }
    }
    return probe.stop();
}

}  // namespace hymoe_bench
