// The GPU benchmark (CUDA builds only; scripts/gpu-check.sh runs it). One process, one device,
// asserts nothing (it exits 1 when a fused part throws); every figure is a ratio to a peak
// measured in the same run:
//   peak       bf16 GEMM 8192³ through Blas::gemm (cuBLAS, fp32 accumulation): TFLOP/s
//   GEMMs      model-shaped bf16 products (a dense projection, one MoE layer's experts in one
//              grouped launch, an fp32 product): TFLOP/s and the fraction of that peak
//   bandwidth  device-to-device cudaMemcpy of 2 GiB: GB/s counted as bytes read + written
//   kernels    RMSNorm and SwiGLU on large bf16 tensors: GB/s moved, fraction of that bandwidth
//   decode     one decode step of the state-reading kernels, bytes that must move / time against
//              that bandwidth: the KDA recurrence (fp32 state read and written) and MLA's absorbed
//              decode over pages (the fp32 latent cache read once)
//   fused      the fused kernels of issue 13 (tests/bench/cuda_bench_fused.h lists the lines)
// Times are the best of several runs between CUDA events, after a warm-up run.
#include <cstdio>
#include <exception>
#include <functional>
#include <vector>

#include <cuda_runtime.h>

#include "cuda_bench.h"
#include "cuda_bench_fused.h"
#include "hymoe/backend/cuda_arena.h"
#include "hymoe/backend/cuda_gemm.h"
#include "hymoe/backend/cuda_ops.h"
#include "hymoe/model/kda.h"

using namespace hymoe;
using namespace hymoe::bench;

int main() {
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
        std::printf("bench_cuda: no CUDA device: skipped\n");
        return 0;
    }
    cudaDeviceProp prop{};
    cudaGetDeviceProperties(&prop, 0);
    std::printf(
        "bench_cuda: %s, %.1f GB\n", prop.name, static_cast<double>(prop.totalGlobalMem) / 1e9);
    cu::Stream s;
    cu::DeviceArena arena(size_t{16} << 30);
    cu::Blas blas(s, arena);

    // ---- the bf16 GEMM peak --------------------------------------------------------------------
    const int64_t P = 8192;
    Tensor pa = filled(arena, s, DType::bf16, {P, P}), pb = filled(arena, s, DType::bf16, {P, P});
    Tensor pc = arena.tensor(DType::bf16, {P, P});
    const double peak = 2.0 * P * P * P / 1e12 / best_seconds(s, 10, [&] {
                            blas.gemm(DType::bf16,
                                      DType::bf16,
                                      false,
                                      true,
                                      P,
                                      P,
                                      P,
                                      1.0f,
                                      pa.data,
                                      P,
                                      pb.data,
                                      P,
                                      0.0f,
                                      pc.data,
                                      P);
                        });
    std::printf("  peak      bf16 GEMM %lld^3: %.1f TFLOP/s\n", static_cast<long long>(P), peak);
    for (Tensor* t : {&pa, &pb, &pc})
        arena.free(t->data);

    // ---- model-shaped GEMMs ----------------------------------------------------------------
    const int64_t n_tok = 4096, d = 7168, ffn = 18432;  // DeepSeek-V3's hidden and dense FFN
    {
        Tensor x = filled(arena, s, DType::bf16, {n_tok, d});
        Tensor w = filled(arena, s, DType::bf16, {ffn, d});
        Tensor y = arena.tensor(DType::bf16, {n_tok, ffn});
        const double tf =
            2.0 * n_tok * d * ffn / 1e12 / best_seconds(s, 10, [&] { blas.linear(x, w, y); });
        std::printf("  dense     bf16 linear [%lld, %lld] -> %lld: %.1f TFLOP/s = %.2f of peak\n",
                    static_cast<long long>(n_tok),
                    static_cast<long long>(d),
                    static_cast<long long>(ffn),
                    tf,
                    tf / peak);
        for (Tensor* t : {&x, &w, &y})
            arena.free(t->data);
    }
    {
        const int64_t E = 64, inter = 2048;  // routed experts of one layer on this rank
        std::vector<int64_t> rows(E);
        int64_t total = 0;
        for (int64_t e = 0; e < E; ++e) {  // uneven loads 0..255 rows, some experts idle
            rows[e] = (e * 37) % 256;
            total += rows[e];
        }
        Tensor x = filled(arena, s, DType::bf16, {total, d});
        Tensor w = filled(arena, s, DType::bf16, {E, inter, d});
        Tensor y = arena.tensor(DType::bf16, {total, inter});
        const double tf = 2.0 * total * d * inter / 1e12 /
                          best_seconds(s, 10, [&] { blas.grouped_linear(x, w, rows, y); });
        std::printf(
            "  experts   bf16 grouped, %lld experts, %lld rows, %lld -> %lld: %.1f TFLOP/s"
            " = %.2f of peak\n",
            static_cast<long long>(E),
            static_cast<long long>(total),
            static_cast<long long>(d),
            static_cast<long long>(inter),
            tf,
            tf / peak);
        for (Tensor* t : {&x, &w, &y})
            arena.free(t->data);
    }
    {
        const int64_t F = 4096;
        Tensor a = filled(arena, s, DType::f32, {F, F}), b = filled(arena, s, DType::f32, {F, F});
        Tensor c = arena.tensor(DType::f32, {F, F});
        const double tf = 2.0 * F * F * F / 1e12 / best_seconds(s, 5, [&] {
                              blas.gemm(DType::f32,
                                        DType::f32,
                                        false,
                                        true,
                                        F,
                                        F,
                                        F,
                                        1.0f,
                                        a.data,
                                        F,
                                        b.data,
                                        F,
                                        0.0f,
                                        c.data,
                                        F);
                          });
        std::printf("  fp32      GEMM %lld^3 (no TF32): %.1f TFLOP/s = %.2f of the bf16 peak\n",
                    static_cast<long long>(F),
                    tf,
                    tf / peak);
        for (Tensor* t : {&a, &b, &c})
            arena.free(t->data);
    }

    // ---- memory bandwidth ------------------------------------------------------------------
    const size_t bytes = size_t{2} << 30;
    void* src = arena.allocate(bytes);
    void* dst = arena.allocate(bytes);
    const double bw = 2.0 * static_cast<double>(bytes) / 1e9 /
                      best_seconds(s, 10, [&] { cu::copy_on_device(dst, src, bytes, s); });
    std::printf("  bandwidth device-to-device copy of 2 GiB: %.0f GB/s (read + write)\n", bw);
    arena.free(src);
    arena.free(dst);

    // ---- memory-bound kernels --------------------------------------------------------------
    {
        const int64_t rows = 16384;
        Tensor x = filled(arena, s, DType::bf16, {rows, d});
        Tensor w = filled(arena, s, DType::bf16, {d});
        Tensor y = arena.tensor(DType::bf16, {rows, d});
        const double gbs = 2.0 * static_cast<double>(x.bytes()) / 1e9 /
                           best_seconds(s, 10, [&] { cu::rms_norm(s, x, w, 1e-6f, y); });
        std::printf("  rms_norm  bf16 [%lld, %lld]: %.0f GB/s = %.2f of the copy bandwidth\n",
                    static_cast<long long>(rows),
                    static_cast<long long>(d),
                    gbs,
                    gbs / bw);
        for (Tensor* t : {&x, &w, &y})
            arena.free(t->data);
    }
    {
        const int64_t rows = 8192;
        Tensor g = filled(arena, s, DType::bf16, {rows, ffn});
        Tensor u = filled(arena, s, DType::bf16, {rows, ffn});
        Tensor y = arena.tensor(DType::bf16, {rows, ffn});
        const double gbs = 3.0 * static_cast<double>(g.bytes()) / 1e9 /
                           best_seconds(s, 10, [&] { cu::swiglu(s, g, u, y); });
        std::printf("  swiglu    bf16 [%lld, %lld]: %.0f GB/s = %.2f of the copy bandwidth\n",
                    static_cast<long long>(rows),
                    static_cast<long long>(ffn),
                    gbs,
                    gbs / bw);
        for (Tensor* t : {&g, &u, &y})
            arena.free(t->data);
    }

    // ---- decode steps ------------------------------------------------------------------------
    {
        const int H = 32 * 64, K = 128, V = 128;  // 64 sequences' 32 heads as one batch of heads
        Tensor S = filled(arena, s, DType::f32, {H, K, V});
        Tensor qk = filled(arena, s, DType::f32, {3, H, K});  // q, k, g
        Tensor v = filled(arena, s, DType::f32, {H, V}), beta = filled(arena, s, DType::f32, {H});
        Tensor o = arena.tensor(DType::f32, {H, V});
        model::KdaScanParams p;
        p.n_tok = 1;
        p.n_head = H;
        p.d_k = K;
        p.d_v = V;
        p.q = qk.ptr<float>();
        p.k = qk.ptr<float>() + int64_t{H} * K;
        p.g = qk.ptr<float>() + 2 * int64_t{H} * K;
        p.v = v.ptr<float>();
        p.beta = beta.ptr<float>();
        p.S = S.ptr<float>();
        p.o = o.ptr<float>();
        const double gbs = 2.0 * static_cast<double>(S.bytes()) / 1e9 /
                           best_seconds(s, 10, [&] { cu::kda_recurrent(s, p); });
        std::printf(
            "  kda step  64 x 32 heads, 128x128 fp32 state: %.0f GB/s = %.2f of the copy"
            " bandwidth\n",
            gbs,
            gbs / bw);
        for (Tensor* t : {&S, &qk, &v, &beta, &o})
            arena.free(t->data);
    }
    {
        const int B = 32, H = 16, r_kv = 512, d_r = 64, pt = 64, n = 4096;
        const int pages_per_seq = n / pt, d_lat = r_kv + d_r;
        Tensor pool = filled(arena, s, DType::f32, {int64_t{B} * pages_per_seq, pt, d_lat});
        Tensor q = filled(arena, s, DType::f32, {B, H, d_lat});
        Tensor scores = arena.tensor(DType::f32, {B, H, n});
        Tensor o = arena.tensor(DType::f32, {B, H, r_kv});
        std::vector<int32_t> table(static_cast<size_t>(B * pages_per_seq)), n_keys(B, n);
        for (size_t i = 0; i < table.size(); ++i)
            table[i] = static_cast<int32_t>(i);
        Tensor dtable = arena.tensor(DType::i32, {static_cast<int64_t>(table.size())});
        Tensor dn = arena.tensor(DType::i32, {B});
        cu::copy_to_device(dtable.data, table.data(), table.size() * sizeof(int32_t), s);
        cu::copy_to_device(dn.data, n_keys.data(), n_keys.size() * sizeof(int32_t), s);
        cu::MlaDecodeParams p;
        p.n_seq = B;
        p.n_head = H;
        p.r_kv = r_kv;
        p.d_r = d_r;
        p.tau = 0.04f;
        p.q_hat = q.ptr<float>();
        p.pages = pool.ptr<float>();
        p.page_stride = int64_t{pt} * d_lat;
        p.row_stride = d_lat;
        p.page_tokens = pt;
        p.block_table = dtable.ptr<int32_t>();
        p.max_pages = pages_per_seq;
        p.n_keys = dn.ptr<int32_t>();
        p.max_keys = n;
        p.scores = scores.ptr<float>();
        p.o_bar = o.ptr<float>();
        const double gbs = static_cast<double>(pool.bytes()) / 1e9 /
                           best_seconds(s, 5, [&] { cu::mla_decode(s, p); });
        std::printf(
            "  mla step  %d seqs x %d keys, %d heads, fp32 latent cache read once: %.0f GB/s"
            " = %.2f of the copy bandwidth\n",
            B,
            n,
            H,
            gbs,
            gbs / bw);
        for (Tensor* t : {&pool, &q, &scores, &o, &dtable, &dn})
            arena.free(t->data);
    }

    // ---- the fused kernels (issue 13) --------------------------------------------------------
    // Each part reports its own failure and the next one still runs (a sticky CUDA error will
    // fail them all, and say so).
    const Limits lim{peak, bw, prop.multiProcessorCount};
    int failed = 0;
    auto part = [&](const char* name, const std::function<void()>& f) {
        try {
            f();
        } catch (const std::exception& e) {
            std::printf("  %s: FAILED: %s\n", name, e.what());
            ++failed;  // its buffers stay allocated: the arena's other users (Blas) live on
        }
        std::fflush(stdout);
    };
    part("kda chunk", [&] { bench_kda_chunk(arena, s, lim); });
    part("kda step", [&] { bench_kda_decode(arena, s, lim); });
    part("indexer", [&] { bench_indexer(arena, s, lim); });
    part("mla sparse", [&] { bench_mla_sparse(arena, s, lim); });
    part("moe layer", [&] { bench_moe_layer(arena, s, blas, lim); });
    part("decode", [&] { bench_decode_graph(arena, s, blas); });
    return failed == 0 ? 0 : 1;
}
