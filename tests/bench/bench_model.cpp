// make bench: the CPU speed of the model, as ratios of references measured in the same run.
// Reports, asserts nothing; one process, no MPI. References (sampled before, between and after
// the model runs, best kept, as the host may be shared): the GEMM peaks (2048³ through ops::gemm,
// best of 4 calls × 3 samples) of OpenBLAS's sgemm and of the kernels the model runs (hymoe's
// AVX-512 GEMM on such a CPU), and the DRAM read bandwidth (memchr over a 1 GiB buffer, best of 2).
// Figures, on the `mid` preset with random weights (seed 1234):
//   prefill  one packed batch of 4 × 512 new tokens, Logits::last: tokens/s, the GEMM rate
//            (ops::gemm_counter flops / seconds) as a fraction of both GEMM peaks, GEMM share of
//            wall. Timed on the second such batch (the steady state of a run); the process's
//            first one, which also faults in the activations' fresh heap pages (the kernel zeroes
//            each on first touch, a one-off of a few tenths of a second), is printed beside it
//   decode   32 greedy steps of those 4 sequences: tokens/s, and weight bytes/s as a fraction of
//            the read bandwidth, counting per step the active params less the embedding table (a
//            lower bound: 4 tokens touch the union of their experts, whose uniform-routing
//            expectation is printed beside it)
//   KDA      kda_chunked (chunks of 64 and of 32) vs kda_recurrent on one 2048-token sequence, H 8,
//            K = V 128, best of 3 samples each; its backward, kda_scan_backward (GEMMs per chunk)
//            vs kda_scan_backward_tokens
//   DSA      attention_forward of the first DSA layer on one 2048-token sequence: the indexer's
//            share of its time (AttnStats); a 256-token prefill chunk after 1k and 8k cached
//            tokens, the time ratio against the context ratio; each again over a bf16 KV pool,
//            where the indexer runs in bf16 (VDPBF16PS) over its bf16-cached keys
//   layers   each layer's prefill seconds split into GEMM and non-GEMM (ForwardStats)
// Each piece also prints CPU time / wall (< threads: another process had the cores), system time
// and minor page faults (getrusage), and the OpenBLAS kernel set in use.
//   decode batch 1 and 32 after 64-token prompts: tokens/s and weight bytes/s against DRAM read
//   decode token vs context  one token through a DSA layer over 1k, 8k and 64k cached tokens
//            (indexer and attention apart) and through a KDA layer (no context; its time is mostly
//            reading its projection weights, printed as the time they take at the DRAM read rate,
//            the rest the short conv, gates and the state update)
// Thread passes: `bench_model 1 2` runs the references, prefill and decode at 1, then 2 OpenBLAS
// threads (KDA and DSA at the first count only); a later pass is skipped when the first prefill
// got under 0.9 of its cores. No argument: one pass at OMP_NUM_THREADS. HYMOE_BENCH_SEQS and
// HYMOE_BENCH_LEN lower the prefill size (printed with the figures).
// bf16 weights, last, at 1 thread: the one-row weight product alone (bf16 and fp32 GEMV over 256
// MiB, one matrix and expert-shaped ones) against DRAM read; the same weights held in bf16 vs
// fp32: resident bytes, decode batch 1 and its weight bytes/s against DRAM read, prefill, and the
// bf16 GEMM rate against a bf16 GEMM peak (gemm_w 2048³). HYMOE_BENCH_BF16_ONLY=1 runs only that
// section.
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
#include "model_bench_blocks.h"
#include "model_bench_common.h"

namespace {

using namespace hymoe_bench;

// ---- report -------------------------------------------------------------------------------------

std::string fmt(const char* f, double a, double b = 0, double c = 0, double d = 0) {
    char s[200];
    std::snprintf(s, sizeof s, f, a, b, c, d);
    return s;
}

void row(const std::string& what, double value, const char* unit, const std::string& note) {
    std::printf("  %-30s %9.1f %-8s %s\n", what.c_str(), value, unit, note.c_str());
}

// CPU time over wall (≈ threads when nothing else competes for the cores), system time and
// minor page faults: where a Span lost time outside its own computation.
std::string os_note(const Span& s) {
    return fmt("cpu/wall %.2f, sys %.2f s, %.0fk page faults",
               (s.user + s.sys) / s.wall,
               s.sys,
               s.faults / 1e3);
}

// Each layer's prefill seconds (mixer + FFN) split into GEMM (ops::gemm) and the rest.
void print_layer_split(const model::ModelConfig& cfg, const model::ForwardStats& phases) {
    std::printf("  prefill by layer: mixer+ffn seconds, GEMM seconds, GEMM share\n");
    for (size_t i = 0; i < cfg.layers.size(); ++i) {
        const double s = phases.mixer_seconds[i] + phases.ffn_seconds[i];
        const double g = phases.layer_gemm_seconds[i];
        std::printf("    layer %2zu %-4s %-5s %8.3f s  GEMM %8.3f s  %5.1f%%  non-GEMM %8.3f s\n",
                    i,
                    model::to_string(cfg.layers[i].mixer),
                    model::to_string(cfg.layers[i].ffn),
                    s,
                    g,
                    s > 0 ? 100 * g / s : 0.0,
                    s - g);
    }
}

// A DSA prefill chunk of 256 tokens after 1k and 8k cached tokens in kv rows: the growth against
// the context ratio 8 (the indexer grows with the context, the sparse attention with top-k only).
void print_dsa_context(const model::Model& m, int dsa, DType kv) {
    const int64_t n_new = 256;
    const model::AttnStats a = dsa_chunk_cost(m, dsa, 1024, n_new, kv);
    const model::AttnStats b = dsa_chunk_cost(m, dsa, 8192, n_new, kv);
    const double ta = a.indexer_seconds + a.attention_seconds;
    const double tb = b.indexer_seconds + b.attention_seconds;
    const std::string tag = kv == DType::bf16 ? ", bf16 KV" : "";
    row("DSA prefill 256 tok, ctx 1k" + tag,
        1e3 * ta,
        "ms",
        fmt("indexer %.1f ms, attention %.1f ms",
            1e3 * a.indexer_seconds,
            1e3 * a.attention_seconds));
    row("DSA prefill 256 tok, ctx 8k" + tag,
        1e3 * tb,
        "ms",
        fmt("indexer %.1f ms, attention %.1f ms; %.2f x the 1k time (context x 8)",
            1e3 * b.indexer_seconds,
            1e3 * b.attention_seconds,
            tb / ta));
}

// ---- bf16 weights (docs/guide/precision.md) -------------------------------------------------

// The bytes a model's weights hold (every tensor of model_tensors, at its storage dtype).
double weight_bytes(model::Model& m) {
    double bytes = 0;
    for (const model::TensorSpec& t : model::model_tensors(m))
        bytes += static_cast<double>(t.dest->view().bytes());
    return bytes;
}

// Best GFLOP/s of C [2048, 2048] = A · Wᵀ with a bf16 W through ops::gemm_w: the kernels a bf16
// model's prefill runs, as its peak.
double bf16_gemm_peak() {
    const int64_t n = 2048;
    Buffer a(DType::f32, {n, n}), w(DType::bf16, {n, n}), c(DType::f32, {n, n});
    Philox rng(seed, 3, 0);
    rng.fill_normal(a.ptr<float>(), static_cast<size_t>(n * n), 0.0f, 1.0f);
    for (int64_t i = 0; i < n * n; ++i)
        w.ptr<uint16_t>()[i] = hymoe::float_to_bf16(a.ptr<float>()[(i * 7) % (n * n)]);
    double best = 1e30;
    for (int rep = 0; rep < 3; ++rep) {
        const double t0 = wall_seconds();
        ops::gemm_w(true,
                    n,
                    n,
                    n,
                    1.0f,
                    a.ptr<float>(),
                    n,
                    ops::weight_ref(w.view()),
                    n,
                    0.0f,
                    c.ptr<float>(),
                    n);
        if (rep > 0)
            best = std::min(best, wall_seconds() - t0);
    }
    return 2.0 * static_cast<double>(n * n * n) / best / 1e9;
}

// The one-row weight products alone (ops::gemm_w, m = 1), bf16 and fp32 weights over the same
// 256 MiB (bigger than the caches): as one [n, d] matrix, and as expert-shaped [I, d] matrices
// taken in a scattered order (a decode step's many small products, each a new stream). Best of
// 5 each, the DRAM read rate sampled between them; weight bytes/s over that rate.
void gemv_rates(int64_t d, int64_t inter, const uint8_t* zeros, int64_t zero_bytes) {
    const int64_t bytes = int64_t{256} << 20;
    Buffer w(DType::u8, {bytes});
    std::fill_n(w.ptr<uint16_t>(), bytes / 2, uint16_t{0x3c00});  // bf16 2^-7, fp32 ~0.008
    std::vector<float> x(static_cast<size_t>(d), 1.0f), y(static_cast<size_t>(bytes / 2 / d));
    auto product = [&](DType t, int64_t n, int64_t offset) {
        const ops::WeightRef ref{w.ptr<uint8_t>() + offset, t};
        ops::gemm_w(true, 1, n, d, 1.0f, x.data(), d, ref, d, 0.0f, y.data(), n);
    };
    const int64_t mat = inter * d;  // elements of one expert-shaped matrix
    double bw = 0, best[2][2] = {{1e30, 1e30}, {1e30, 1e30}};  // [bf16, fp32][whole, experts]
    for (int rep = 0; rep < 5; ++rep) {
        bw = std::max(bw, read_gbps(zeros, zero_bytes, 1) * 1e9);
        for (int f = 0; f < 2; ++f) {
            const DType t = f == 0 ? DType::bf16 : DType::f32;
            const auto size = static_cast<int64_t>(dtype_size(t)), n_mat = bytes / (mat * size);
            double t0 = wall_seconds();
            product(t, bytes / (size * d), 0);
            best[f][0] = std::min(best[f][0], wall_seconds() - t0);
            t0 = wall_seconds();
            for (int64_t i = 0; i < n_mat; ++i)  // 97 is prime to n_mat: each matrix once
                product(t, inter, (i * 97 + rep) % n_mat * mat * size);
            best[f][1] = std::min(best[f][1], wall_seconds() - t0);
        }
    }
    const double b = static_cast<double>(bytes);
    const std::string shape =
        fmt("%.0f x %.0f", static_cast<double>(inter), static_cast<double>(d));
    row("bf16 GEMV, one 256 MiB weight",
        b / best[0][0] / 1e9,
        "GB/s",
        fmt("%.2f of DRAM read %.1f GB/s (goal >= 0.9); fp32 %.2f",
            b / best[0][0] / bw,
            bw / 1e9,
            b / best[1][0] / bw));
    row("bf16 GEMV, " + shape + " matrices",
        b / best[0][1] / 1e9,
        "GB/s",
        fmt("%.2f of DRAM read; fp32 %.2f (256 MiB of them, scattered)",
            b / best[0][1] / bw,
            b / best[1][1] / bw));
}

// The same `mid` weights held in bf16 against m32 (fp32), at one thread: resident bytes, decode at
// batch 1 (after a 64-token prompt, best of 4 alternated rounds of 4 steps) with its weight bytes/s
// against the DRAM read rate measured here, and prefill (2 × 256 tokens) with the bf16 GEMM rate
// against bf16_gemm_peak.
void bf16_weights(const model::ModelConfig& cfg,
                  model::Model& m32,
                  double step_params,
                  const uint8_t* zeros,
                  int64_t zero_bytes) {
    openblas_set_num_threads(1);
    model::Model m16 = model::make_model(cfg);
    m16.weight_dtype = DType::bf16;
    model::init_model_random(m16, seed);
    std::printf("\nbf16 weights, 1 thread: products by %s\n", ops::to_string(ops::weight_kernel()));
    gemv_rates(cfg.hidden_size, cfg.moe.moe_intermediate, zeros, zero_bytes);
    const double b32 = weight_bytes(m32), b16 = weight_bytes(m16), ratio = b16 / b32;
    row("resident weights bf16 / fp32",
        ratio,
        "x",
        fmt("%.0f MB / %.0f MB (goal <= 0.52)", b16 / 1e6, b32 / 1e6));
    // decode after a 64-token prompt, 4 rounds of 4 steps with the two models alternated and the
    // DRAM rate sampled between rounds, best round of each kept: the host's load drifts between
    // runs of a few hundred ms, and a slow moment then lowers one figure, not the ratio
    std::vector<model::SequenceState> s32, s16;
    model::ForwardStats unused;
    prefill(m32, 1, 64, s32, unused);
    prefill(m16, 1, 64, s16, unused);
    double bw = 0, t32 = 1e30, t16 = 1e30;  // B/s; seconds per step
    for (int round = 0; round < 4; ++round) {
        bw = std::max(bw, read_gbps(zeros, zero_bytes, 1) * 1e9);
        t32 = std::min(t32, decode(m32, 4, s32).wall / 4);
        t16 = std::min(t16, decode(m16, 4, s16).wall / 4);
    }
    // a step reads the active params less the embedding, each at the bytes its dtype holds
    // (fp32: 4; bf16: 4 · the resident ratio, the vectors staying fp32)
    const double bytes16 = step_params * 4 * ratio / t16;
    row("decode batch 1 bf16 / fp32",
        t32 / t16,
        "x",
        fmt("%.1f / %.1f ms/step (goal >= 1.8)", 1e3 * t16, 1e3 * t32));
    row("  bf16 weight B/s",
        bytes16 / 1e9,
        "GB/s",
        fmt("%.2f of DRAM read %.1f GB/s (goal >= 0.8); fp32 %.2f",
            bytes16 / bw,
            bw / 1e9,
            step_params * 4 / t32 / bw));
    std::vector<model::SequenceState> states;
    const Span p32 = prefill(m32, 2, 256, states, unused);
    const Span p16 = prefill(m16, 2, 256, states, unused);
    const double peak16 = bf16_gemm_peak();
    row("prefill 2 x 256 tok bf16 / fp32",
        p32.wall / p16.wall,
        "x",
        fmt("%.0f / %.0f tok/s (goal >= 1.3)", 512 / p16.wall, 512 / p32.wall));
    row("  bf16 model GEMM rate",
        p16.gemm_gflops(),
        "GFLOP/s",
        fmt("%.2f of the bf16 GEMM peak %.0f GFLOP/s (gemm_w 2048^3); fp32 model %.0f GFLOP/s",
            p16.gemm_gflops() / peak16,
            peak16,
            p32.gemm_gflops()));
}

}  // namespace

int main(int argc, char** argv) {
    hymoe::reuse_freed_memory();  // as the hymoe binary does (core/allocator.h)
    std::vector<int> passes;
    for (int i = 1; i < argc; ++i)
        passes.push_back(std::max(1, std::atoi(argv[i])));
    if (passes.empty())
        passes.push_back(openblas_get_num_threads());
    const int64_t n_seq = env_int("HYMOE_BENCH_SEQS", 4), len = env_int("HYMOE_BENCH_LEN", 512);
    const int64_t steps = 32, scan_len = 2048;
    const auto n_seq_d = static_cast<double>(n_seq);

    const model::ModelConfig cfg = model::preset_config("mid");
    const model::ParamCount params = model::count_params(cfg);
    Probe init;
    model::Model m = model::make_model(cfg);
    model::init_model_random(m, seed);
    std::printf("model bench: mid preset, %.0fM params (%.0fM active), random init %.1f s\n",
                static_cast<double>(params.total) / 1e6,
                static_cast<double>(params.active) / 1e6,
                init.stop().wall);
    const char* coretype = std::getenv("OPENBLAS_CORETYPE");
    const std::string core = openblas_get_corename();
    std::printf(
        "OpenBLAS kernels: %s (OPENBLAS_CORETYPE %s), CPU %s AVX-512%s; fp32 products by %s\n",
        core.c_str(),
        coretype != nullptr ? coretype : "unset",
        cpu_has_avx512() ? "with" : "without",
        cpu_has_avx512() && (core == "Haswell" || core == "Zen") ? " (OpenBLAS runs AVX2 kernels)"
                                                                 : "",
        ops::to_string(ops::weight_kernel()));

    // Weights one decode step streams: the active params less the input embedding (a token reads
    // one row of it); with n_seq tokens the routed part grows to the union of their experts,
    // E·(1 − (1 − k/E)^n_seq) per MoE layer under uniform routing.
    const double step_params =
        static_cast<double>(params.active - cfg.vocab_size * cfg.hidden_size);
    double n_moe = 0;
    for (const model::LayerSpec& spec : cfg.layers)
        n_moe += spec.ffn == model::Ffn::moe ? 1 : 0;
    const auto E = static_cast<double>(cfg.moe.n_routed_experts);
    const auto top_k = static_cast<double>(cfg.moe.top_k);
    const double expert = 3.0 * static_cast<double>(cfg.hidden_size * cfg.moe.moe_intermediate);
    const double union_experts = E * (1 - std::pow(1 - top_k / E, n_seq_d));
    const double union_params = step_params + n_moe * (union_experts - top_k) * expert;

    const int64_t bw_bytes = int64_t{1} << 30;
    Buffer bw_buf(DType::u8, {bw_bytes});  // zero-filled: every page touched
    BlasPeak blas;
    std::vector<model::SequenceState> states;
    double first_cpu_wall = 0;  // (user + sys) / wall of the first pass's prefill
    const bool bf16_only = env_int("HYMOE_BENCH_BF16_ONLY", 0) != 0;
    for (size_t pass = 0; pass < passes.size() && !bf16_only; ++pass) {
        const int threads = passes[pass];
        if (pass > 0 && first_cpu_wall < 0.9 * passes[0]) {  // 2 threads would share a busy core
            std::printf(
                "\n%d thread(s): skipped, the host is busy (cpu/wall %.2f in the first "
                "prefill)\n",
                threads,
                first_cpu_wall);
            continue;
        }
        openblas_set_num_threads(threads);
        // References sampled around the model runs, best kept: the host may be shared.
        double peak = blas.gflops(ops::WeightKernel::automatic);
        double blas_peak = blas.gflops(ops::WeightKernel::portable);
        double bw = read_gbps(bw_buf.ptr<uint8_t>(), bw_bytes, threads) * 1e9;  // B/s
        model::ForwardStats phases;
        const Span cold = pass == 0 ? prefill(m, n_seq, len, states, phases) : Span{};
        const Span pf = prefill(m, n_seq, len, states, phases);
        peak = std::max(peak, blas.gflops(ops::WeightKernel::automatic));
        blas_peak = std::max(blas_peak, blas.gflops(ops::WeightKernel::portable));
        const Span dec = decode(m, steps, states);
        peak = std::max(peak, blas.gflops(ops::WeightKernel::automatic));
        blas_peak = std::max(blas_peak, blas.gflops(ops::WeightKernel::portable));
        bw = std::max(bw, read_gbps(bw_buf.ptr<uint8_t>(), bw_bytes, threads) * 1e9);
        std::printf("\n%d thread(s) (OpenBLAS %d)\n", threads, openblas_get_num_threads());
        row("BLAS peak, sgemm 2048^3", blas_peak, "GFLOP/s", "(OpenBLAS, best of 3 samples)");
        row("GEMM peak, ops::gemm 2048^3",
            peak,
            "GFLOP/s",
            fmt("%.2f x OpenBLAS (the kernels the model runs, best of 3 samples)",
                peak / blas_peak));
        row("DRAM read, 1 GiB", bw / 1e9, "GB/s", "(reference, best of 2 samples)");

        row(fmt("prefill %.0f x %.0f tok", n_seq_d, static_cast<double>(len)),
            n_seq_d * static_cast<double>(len) / pf.wall,
            "tok/s",
            fmt("%.2f s wall; ", pf.wall) + os_note(pf));
        if (pass == 0)
            row("  first prefill (fresh heap)",
                n_seq_d * static_cast<double>(len) / cold.wall,
                "tok/s",
                fmt("%.2f s wall, GEMM %.1f%% of wall; ",
                    cold.wall,
                    100 * cold.gemm_seconds / cold.wall) +
                    os_note(cold));
        row("  model GEMM rate",
            pf.gemm_gflops(),
            "GFLOP/s",
            fmt("%.2f of the GEMM peak, %.2f of OpenBLAS sgemm (goal 0.60)",
                pf.gemm_gflops() / peak,
                pf.gemm_gflops() / blas_peak));
        row("  GEMM share of wall",
            100 * pf.gemm_seconds / pf.wall,
            "%",
            fmt("%.2f TFLOP in GEMMs", pf.gemm_flops / 1e12));
        double kda_s = 0, attn_s = 0, ffn_s = 0;
        for (size_t i = 0; i < cfg.layers.size(); ++i) {
            (cfg.layers[i].mixer == model::Mixer::kda ? kda_s : attn_s) += phases.mixer_seconds[i];
            ffn_s += phases.ffn_seconds[i];
        }
        row("  wall by phase, KDA layers",
            100 * kda_s / pf.wall,
            "%",
            fmt("attention layers %.0f%% (indexer %.0f%%), FFN/MoE %.0f%%, embed+head %.0f%%",
                100 * attn_s / pf.wall,
                100 * phases.attn.indexer_seconds / pf.wall,
                100 * ffn_s / pf.wall,
                100 * phases.head_seconds / pf.wall));
        print_layer_split(cfg, phases);

        const double bytes_per_s = step_params * 4 * static_cast<double>(steps) / dec.wall;
        row(fmt("decode %.0f x %.0f steps", n_seq_d, static_cast<double>(steps)),
            n_seq_d * static_cast<double>(steps) / dec.wall,
            "tok/s",
            fmt("%.1f ms/step, GEMM %.0f%% of wall; ",
                1e3 * dec.wall / static_cast<double>(steps),
                100 * dec.gemm_seconds / dec.wall) +
                os_note(dec));
        row("  weight B/s, active params",
            bytes_per_s / 1e9,
            "GB/s",
            fmt("%.2f of DRAM read (%.0f MB/step)", bytes_per_s / bw, step_params * 4e-6));
        row("  weight B/s, expert union",
            bytes_per_s * union_params / step_params / 1e9,
            "GB/s",
            fmt("%.2f of DRAM read (%.0f MB/step, est.)",
                bytes_per_s * union_params / step_params / bw,
                union_params * 4e-6));

        if (pass > 0)
            continue;
        first_cpu_wall = (pf.user + pf.sys) / pf.wall;
        const auto [chunked, chunked32, recurrent, back_chunked, back_tokens] =
            kda_scans(scan_len, cfg.kda.n_head, cfg.kda.head_dim, cfg.kda.head_dim);
        const auto scan_tok = static_cast<double>(scan_len);
        row("KDA chunked (64), 2048 tok",
            scan_tok / chunked.wall,
            "tok/s",
            fmt("%.2f x recurrent; GEMM %.0f%% of wall at %.1f GFLOP/s",
                recurrent.wall / chunked.wall,
                100 * chunked.gemm_seconds / chunked.wall,
                chunked.gemm_gflops()));
        row("KDA chunked (32), 2048 tok",
            scan_tok / chunked32.wall,
            "tok/s",
            fmt("%.2f x recurrent; GEMM %.0f%% of wall at %.1f GFLOP/s",
                recurrent.wall / chunked32.wall,
                100 * chunked32.gemm_seconds / chunked32.wall,
                chunked32.gemm_gflops()));
        row("KDA recurrent, 2048 tok", scan_tok / recurrent.wall, "tok/s", "");
        row("KDA backward chunked, 2048 tok",
            scan_tok / back_chunked.wall,
            "tok/s",
            fmt("%.2f x per-token; GEMM %.0f%% of wall at %.1f GFLOP/s",
                back_tokens.wall / back_chunked.wall,
                100 * back_chunked.gemm_seconds / back_chunked.wall,
                back_chunked.gemm_gflops()));
        row("KDA backward per-token, 2048 tok", scan_tok / back_tokens.wall, "tok/s", "");
        int dsa = 0;
        while (cfg.layers[static_cast<size_t>(dsa)].mixer != model::Mixer::dsa)
            ++dsa;
        for (const DType kv : {DType::f32, DType::bf16}) {  // bf16 KV: the bf16 indexer
            Span attn;
            const model::AttnStats st = dsa_layer(m, dsa, scan_len, kv, attn);
            const double total = st.indexer_seconds + st.attention_seconds;
            row(fmt(kv == DType::bf16 ? "DSA layer %.0f, 2048 tok, bf16 KV"
                                      : "DSA layer %.0f, 2048 tok",
                    dsa),
                scan_tok / total,
                "tok/s",
                fmt("indexer %.0f%% of its time; GEMM %.0f%% of wall at %.1f GFLOP/s",
                    100 * st.indexer_seconds / total,
                    100 * attn.gemm_seconds / attn.wall,
                    attn.gemm_gflops()));
        }
        for (const DType kv : {DType::f32, DType::bf16})
            print_dsa_context(m, dsa, kv);
        // decode at batch 1 and 32 after 64-token prompts: weight bytes per step as a fraction of
        // the DRAM read rate (batch 1 reads the active params, batch 32 the union of experts)
        for (const int64_t batch : {int64_t{1}, int64_t{32}}) {
            std::vector<model::SequenceState> bs;
            model::ForwardStats unused;
            prefill(m, batch, 64, bs, unused);
            const Span b = decode(m, 16, bs);
            const auto nb = static_cast<double>(batch);
            const double bytes =
                4 *
                (step_params + n_moe * (E * (1 - std::pow(1 - top_k / E, nb)) - top_k) * expert);
            row(fmt("decode batch %.0f, 16 steps", nb),
                nb * 16 / b.wall,
                "tok/s",
                fmt("%.1f ms/step; weights %.2f of DRAM read (%.0f MB/step)",
                    1e3 * b.wall / 16,
                    bytes * 16 / b.wall / bw,
                    bytes * 1e-6));
        }
        // decode cost per token against the context: KDA flat, DSA attention bounded by its
        // top-k, the indexer's scan over every cached key growing linearly
        const double kda_ms = 1e3 * kda_decode_cost(m, 0), kda_bytes = kda_weight_bytes(m, 0);
        for (const int64_t context : {int64_t{1024}, int64_t{8192}, int64_t{65536}}) {
            const model::AttnStats c = decode_cost(m, dsa, context);
            row(fmt("decode token, context %.0fk", static_cast<double>(context / 1024)),
                1e3 * (c.indexer_seconds + c.attention_seconds),
                "ms",
                fmt("DSA layer: indexer %.3f ms, attention (top-%.0f) %.3f ms; ",
                    1e3 * c.indexer_seconds,
                    static_cast<double>(cfg.indexer.top_k),
                    1e3 * c.attention_seconds) +
                    fmt("KDA layer %.3f ms (its %.0f MB of weights: %.3f ms at DRAM read)",
                        kda_ms,
                        kda_bytes * 1e-6,
                        1e3 * kda_bytes / bw));
        }
    }
    bf16_weights(cfg, m, step_params, bw_buf.ptr<uint8_t>(), bw_bytes);
    return 0;
}
