// The fused kernels' part of the GPU benchmark (tests/bench/bench_cuda.cpp; every figure a
// fraction of the Limits measured in the same run):
//   kda chunk   chunked prefill, T 8192, H 96, K = V 128: TFLOP/s of the chunk form's products
//               (causal triangles counted once) against the bf16 peak, and bytes moved against
//               the copy bandwidth; then issue 12's recurrent kernel on the same input
//   kda decode  one token of 64 sequences × 32 heads: state bytes (read + write) / time
//   indexer     top-2048 of 64 heads × 128 at 8k, 32k, 128k context: a decode batch of 64
//               sequences (paged keys; bytes of keys read against the bandwidth, and TFLOP/s) and
//               a prefill block of 2048 queries (TFLOP/s); at 8k also issue 12's scores + causal
//               top-k path on the same prefill block
//   mla sparse  64 queries × 128 heads over 2048 selected keys of 8k each: unique latent bytes
//               gathered / time, against issue 12's mla_decode with the same key lists
//   moe layer   Kimi-Linear-48B's routed experts at 8k tokens (E 256, top 8, d 2304, I 1024):
//               route + dispatch plan + grouped GEMMs + combine, MFU = expert FLOPs / time / peak,
//               and cuBLAS's grouped GEMM (Blas::grouped_linear) on the same rows
//   decode      a 27-layer decode step at Kimi-Linear sizes (RMSNorm, q/k/v/o projections, KDA
//               step, router, MoE, residuals), eager launches against a CUDA graph replay, at
//               batch 1, 8 and 64
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <vector>

#include "cuda_bench.h"
#include "hymoe/backend/cuda_fused.h"
#include "hymoe/backend/cuda_gemm.h"
#include "hymoe/backend/cuda_graph.h"
#include "hymoe/backend/cuda_ops.h"
#include "hymoe/model/kda.h"

namespace hymoe::bench {

// Multiply-adds ×2 of the chunk form's products per head and chunk of C = 64 tokens: the
// triangles Akk, Aqk (C² K), T Kg and T V (C(C+1)/2 (K + V)), W S and Qg S (2 C K V), Aqk V'
// (C(C+1)/2 V) and the state update Klᵀ V' (C K V).
inline double kda_chunk_flops(int64_t T, int H, int K, int V) {
    const double C = cu::kKdaChunk, tri = C * (C + 1) / 2;
    const double per_chunk = C * C * K + tri * (K + V) + 3 * C * K * V + tri * V;
    return 2.0 * per_chunk * std::ceil(static_cast<double>(T) / C) * H;
}

inline void bench_kda_chunk(cu::DeviceArena& arena, const cu::Stream& s, const Limits& lim) {
    const int64_t T = 8192;
    const int H = 96, K = 128, V = 128;
    double chunk_f32 = 0;
    for (DType t : {DType::bf16, DType::f32}) {
        Tensor q = random_filled(arena, s, t, {T, H, K}, 0.088f, 1);
        Tensor k = random_filled(arena, s, t, {T, H, K}, 0.088f, 2);
        Tensor v = random_filled(arena, s, t, {T, H, V}, 1.0f, 3);
        Tensor g = filled(arena, s, DType::f32, {T, H, K}, -0.02f);
        Tensor beta = filled(arena, s, DType::f32, {T, H}, 0.5f);
        Tensor S = filled(arena, s, DType::f32, {1, H, K, V}, 0.0f);
        Tensor o = arena.tensor(t, {T, H, V});
        Tensor start = device_array<int64_t>(arena, s, {0, T});
        cu::KdaBatchParams p;
        p.n_seq = 1;
        p.n_head = H;
        p.d_k = K;
        p.d_v = V;
        p.dtype = t;
        p.seq_start = start.ptr<int64_t>();
        p.q = q.data;
        p.k = k.data;
        p.v = v.data;
        p.g = g.ptr<float>();
        p.beta = beta.ptr<float>();
        p.S = S.ptr<float>();
        p.o = o.data;
        const double sec = best_seconds(s, 5, [&] { cu::kda_chunk_prefill(s, p); });
        const double tf = kda_chunk_flops(T, H, K, V) / 1e12 / sec;
        const double es = static_cast<double>(dtype_size(t));
        const double bytes = static_cast<double>(T) * H * ((2.0 * K + 2.0 * V) * es + K * 4.0 + 4) +
                             2.0 * H * K * V * 4;
        std::printf(
            "  kda chunk T %lld H %d K %d V %d %s: %.2f ms, %.1f TFLOP/s = %.3f of peak, %.0f GB/s"
            " = %.2f of the copy bandwidth\n",
            static_cast<long long>(T),
            H,
            K,
            V,
            to_string(t),
            sec * 1e3,
            tf,
            tf / lim.peak_tflops,
            bytes / 1e9 / sec,
            bytes / 1e9 / sec / lim.copy_gbs);
        if (t == DType::f32) {
            chunk_f32 = sec;
            model::KdaScanParams r;
            r.n_tok = T;
            r.n_head = H;
            r.d_k = K;
            r.d_v = V;
            r.q = q.ptr<float>();
            r.k = k.ptr<float>();
            r.v = v.ptr<float>();
            r.g = g.ptr<float>();
            r.beta = beta.ptr<float>();
            r.S = S.ptr<float>();
            r.o = o.ptr<float>();
            const double rec = best_seconds(s, 1, [&] { cu::kda_recurrent(s, r); });
            std::printf(
                "  kda scan  issue 12's recurrent kernel, same input (f32): %.2f ms = %.1fx"
                " the chunk kernel's time\n",
                rec * 1e3,
                rec / chunk_f32);
        }
        release(arena, {&q, &k, &v, &g, &beta, &S, &o, &start});
    }
}

inline void bench_kda_decode(cu::DeviceArena& arena, const cu::Stream& s, const Limits& lim) {
    const int B = 64, H = 32, K = 128, V = 128;
    Tensor qkg = random_filled(arena, s, DType::bf16, {2, B, H, K}, 0.088f, 4);
    Tensor v = random_filled(arena, s, DType::bf16, {B, H, V}, 1.0f, 5);
    Tensor g = filled(arena, s, DType::f32, {B, H, K}, -0.02f);
    Tensor beta = filled(arena, s, DType::f32, {B, H}, 0.5f);
    Tensor S = filled(arena, s, DType::f32, {B, H, K, V}, 0.0f);
    Tensor o = arena.tensor(DType::bf16, {B, H, V});
    cu::KdaBatchParams p;
    p.n_seq = B;
    p.n_head = H;
    p.d_k = K;
    p.d_v = V;
    p.dtype = DType::bf16;
    p.q = qkg.data;
    p.k = qkg.ptr<uint16_t>() + int64_t{B} * H * K;
    p.v = v.data;
    p.g = g.ptr<float>();
    p.beta = beta.ptr<float>();
    p.S = S.ptr<float>();
    p.o = o.data;
    const double sec = best_seconds(s, 10, [&] { cu::kda_decode_step(s, p); });
    const double gbs = 2.0 * static_cast<double>(S.bytes()) / 1e9 / sec;
    std::printf(
        "  kda step  fused, %d seqs x %d heads, 128x128 fp32 state: %.1f us, %.0f GB/s = %.2f"
        " of the copy bandwidth\n",
        B,
        H,
        sec * 1e6,
        gbs,
        gbs / lim.copy_gbs);
    release(arena, {&qkg, &v, &g, &beta, &S, &o});
}

inline void bench_indexer(cu::DeviceArena& arena, const cu::Stream& s, const Limits& lim) {
    const int H = 64, d = 128, top = 2048, B = 64, page = 64, n_pre = 2048;
    Tensor w = random_filled(arena, s, DType::f32, {n_pre, H}, 0.01f, 6);
    for (int L : {8192, 32768, 131072}) {
        // decode: 64 sequences of L keys each, on distinct pages
        {
            const int pages = L / page;
            Tensor keys =
                random_filled(arena, s, DType::bf16, {int64_t{B} * pages, page, d}, 1.0f, 7);
            Tensor q = random_filled(arena, s, DType::bf16, {B, H * d}, 1.0f, 8);
            std::vector<int32_t> table(static_cast<size_t>(B) * pages), visible(B, L), seq(B);
            std::iota(table.begin(), table.end(), 0);
            std::iota(seq.begin(), seq.end(), 0);
            Tensor dtable = device_array(arena, s, table);
            Tensor dvis = device_array(arena, s, visible);
            Tensor dseq = device_array(arena, s, seq);
            Tensor idx = arena.tensor(DType::i32, {B, top});
            const cu::IndexerPlan plan =
                cu::indexer_topk_plan(B, L, H, d, top, false, lim.sm_count);
            void* scratch = plan.scratch_bytes ? arena.allocate(plan.scratch_bytes) : nullptr;
            cu::IndexerTopkParams p;
            p.n_q = B;
            p.n_head = H;
            p.d = d;
            p.top_k = top;
            p.q_dtype = DType::bf16;
            p.q = q.data;
            p.w = w.ptr<float>();
            p.visible = dvis.ptr<int32_t>();
            p.seq = dseq.ptr<int32_t>();
            p.keys.rows = keys.data;
            p.keys.dtype = DType::bf16;
            p.keys.row_stride = d;
            p.keys.page_stride = int64_t{page} * d;
            p.keys.page_tokens = page;
            p.keys.block_table = dtable.ptr<int32_t>();
            p.keys.max_pages = pages;
            p.idx = idx.ptr<int32_t>();
            p.scratch = scratch;
            const double sec = best_seconds(s, 5, [&] { cu::indexer_topk(s, p, plan); });
            const double gbs = static_cast<double>(keys.bytes()) / 1e9 / sec;
            const double tf = 2.0 * B * L * H * d / 1e12 / sec;
            std::printf(
                "  indexer   decode %d seqs at %dk: %.3f ms (%d splits), keys %.0f GB/s = %.2f of"
                " the copy bandwidth, %.1f TFLOP/s = %.3f of peak\n",
                B,
                L / 1024,
                sec * 1e3,
                plan.n_split,
                gbs,
                gbs / lim.copy_gbs,
                tf,
                tf / lim.peak_tflops);
            if (scratch)
                arena.free(scratch);
            release(arena, {&keys, &q, &dtable, &dvis, &dseq, &idx});
        }
        // prefill: the last 2048 tokens of an L-token sequence
        {
            Tensor keys = random_filled(arena, s, DType::bf16, {L, d}, 1.0f, 9);
            Tensor q = random_filled(arena, s, DType::bf16, {n_pre, H * d}, 1.0f, 10);
            std::vector<int32_t> visible(n_pre);
            double pairs = 0;
            for (int i = 0; i < n_pre; ++i) {
                visible[static_cast<size_t>(i)] = L - n_pre + i + 1;
                pairs += visible[static_cast<size_t>(i)];
            }
            Tensor dvis = device_array(arena, s, visible);
            Tensor idx = arena.tensor(DType::i32, {n_pre, top});
            const cu::IndexerPlan plan =
                cu::indexer_topk_plan(n_pre, L, H, d, top, true, lim.sm_count);
            cu::IndexerTopkParams p;
            p.n_q = n_pre;
            p.n_head = H;
            p.d = d;
            p.top_k = top;
            p.q_dtype = DType::bf16;
            p.q = q.data;
            p.w = w.ptr<float>();
            p.visible = dvis.ptr<int32_t>();
            p.keys.rows = keys.data;
            p.keys.dtype = DType::bf16;
            p.keys.row_stride = d;
            p.idx = idx.ptr<int32_t>();
            const double sec = best_seconds(s, 3, [&] { cu::indexer_topk(s, p, plan); });
            const double tf = 2.0 * pairs * H * d / 1e12 / sec;
            std::printf(
                "  indexer   prefill %d queries at %dk: %.2f ms, %.1f TFLOP/s = %.3f of peak\n",
                n_pre,
                L / 1024,
                sec * 1e3,
                tf,
                tf / lim.peak_tflops);
            if (L == 8192) {  // issue 12's path: fp32 scores [n_q, L], then the causal top-k
                Tensor q32 = random_filled(arena, s, DType::f32, {n_pre, H * d}, 1.0f, 10);
                Tensor k32 = random_filled(arena, s, DType::f32, {L, d}, 1.0f, 9);
                Tensor scores = arena.tensor(DType::f32, {n_pre, L});
                Tensor idx64 = arena.tensor(DType::i64, {n_pre, top});
                const double old = best_seconds(s, 1, [&] {
                    cu::indexer_scores(s, q32, w, k32, scores);
                    cu::top_k_rows_causal(s, scores, L - n_pre, top, idx64);
                });
                std::printf(
                    "  indexer   issue 12's scores + causal top-k, same block (f32): %.2f ms"
                    " = %.1fx the fused kernel's time\n",
                    old * 1e3,
                    old / sec);
                release(arena, {&q32, &k32, &scores, &idx64});
            }
            release(arena, {&keys, &q, &dvis, &idx});
        }
    }
    release(arena, {&w});
}

inline void bench_mla_sparse(cu::DeviceArena& arena, const cu::Stream& s, const Limits& lim) {
    const int B = 64, H = 128, r_kv = 512, d_r = 64, d_lat = r_kv + d_r, n = 8192, page = 64,
              n_sel = 2048;
    const int pages = n / page;
    Tensor pool = random_filled(arena, s, DType::f32, {int64_t{B} * pages, page, d_lat}, 1.0f, 11);
    Tensor q = random_filled(arena, s, DType::f32, {B, H, d_lat}, 0.05f, 12);
    std::vector<int32_t> table(static_cast<size_t>(B) * pages), keys(B, n), seq(B),
        sel(static_cast<size_t>(B) * n_sel);
    std::iota(table.begin(), table.end(), 0);
    std::iota(seq.begin(), seq.end(), 0);
    Philox rng(5, 13, 0);
    for (int b = 0; b < B; ++b)  // 2048 distinct keys: a random stride through the context
        for (int j = 0; j < n_sel; ++j)
            sel[static_cast<size_t>(b) * n_sel + j] =
                static_cast<int32_t>((j * 4 + static_cast<int>(rng.uniform() * 4)) % n);
    Tensor dtable = device_array(arena, s, table), dkeys = device_array(arena, s, keys);
    Tensor dseq = device_array(arena, s, seq), dsel = device_array(arena, s, sel);
    Tensor o = arena.tensor(DType::f32, {B, H, r_kv});
    const double unique = static_cast<double>(B) * n_sel * d_lat * 4;
    cu::MlaSparseParams p;
    p.n_q = B;
    p.n_head = H;
    p.r_kv = r_kv;
    p.d_r = d_r;
    p.tau = 0.0723f;
    p.q_hat = q.ptr<float>();
    p.cache.rows = pool.data;
    p.cache.dtype = DType::f32;
    p.cache.row_stride = d_lat;
    p.cache.page_stride = int64_t{page} * d_lat;
    p.cache.page_tokens = page;
    p.cache.block_table = dtable.ptr<int32_t>();
    p.cache.max_pages = pages;
    p.seq = dseq.ptr<int32_t>();
    p.visible = dkeys.ptr<int32_t>();
    p.selected = dsel.ptr<int32_t>();
    p.n_selected = n_sel;
    p.o_bar = o.ptr<float>();
    const cu::MlaSparsePlan plan = cu::mla_sparse_plan(H, r_kv, d_r);
    const double sec = best_seconds(s, 5, [&] { cu::mla_sparse(s, p, plan); });
    std::printf(
        "  mla sparse %d queries x %d heads, %d of %d keys, fp32 pages: %.3f ms, %.0f GB/s of"
        " latent rows = %.2f of the copy bandwidth\n",
        B,
        H,
        n_sel,
        n,
        sec * 1e3,
        unique / 1e9 / sec,
        unique / 1e9 / sec / lim.copy_gbs);
    Tensor scores = arena.tensor(DType::f32, {B, H, n_sel});
    cu::MlaDecodeParams m;
    m.n_seq = B;
    m.n_head = H;
    m.r_kv = r_kv;
    m.d_r = d_r;
    m.tau = p.tau;
    m.q_hat = q.ptr<float>();
    m.pages = pool.ptr<float>();
    m.page_stride = int64_t{page} * d_lat;
    m.row_stride = d_lat;
    m.page_tokens = page;
    m.block_table = dtable.ptr<int32_t>();
    m.max_pages = pages;
    m.n_keys = dkeys.ptr<int32_t>();
    m.selected = dsel.ptr<int32_t>();
    m.n_selected = n_sel;
    m.max_keys = n_sel;
    m.scores = scores.ptr<float>();
    m.o_bar = o.ptr<float>();
    const double old = best_seconds(s, 1, [&] { cu::mla_decode(s, m); });
    std::printf(
        "  mla sparse issue 12's mla_decode, same key lists: %.3f ms = %.1fx the fused time\n",
        old * 1e3,
        old / sec);
    release(arena, {&pool, &q, &dtable, &dkeys, &dseq, &dsel, &o, &scores});
}

// One MoE layer's routed experts on the device: weights, and the buffers of a batch of up to
// max_tok tokens.
struct MoeLayer {
    int E = 256, k = 8, d = 2304, inter = 1024;
    Tensor w1, w3, w2, bias;
    MoeLayer(cu::DeviceArena& arena, const cu::Stream& s) {
        w1 = random_filled(arena, s, DType::bf16, {E, inter, d}, 0.02f, 14);
        w3 = random_filled(arena, s, DType::bf16, {E, inter, d}, 0.02f, 15);
        w2 = random_filled(arena, s, DType::bf16, {E, d, inter}, 0.02f, 16);
        bias = random_filled(arena, s, DType::f32, {E}, 0.01f, 17);
    }
    void free(cu::DeviceArena& arena) { release(arena, {&w1, &w3, &w2, &bias}); }
    cu::MoeRouteParams route(int n_tok, const Tensor& logits, Tensor& idx, Tensor& weight) const {
        cu::MoeRouteParams p;
        p.n_tok = n_tok;
        p.n_exp = E;
        p.top_k = k;
        p.scale = 2.446f;
        p.renorm_eps = 1e-20f;
        p.logits = logits.ptr<float>();
        p.bias = bias.ptr<float>();
        p.idx = idx.ptr<int32_t>();
        p.weight = weight.ptr<float>();
        return p;
    }
    cu::MoeExpertParams experts(const Tensor& x, Tensor& h, Tensor& out) const {
        cu::MoeExpertParams p;
        p.d = d;
        p.inter = inter;
        p.x = x.data;
        p.w1 = w1.data;
        p.w3 = w3.data;
        p.w2 = w2.data;
        p.h = h.data;
        p.out = out.data;
        return p;
    }
};

inline void bench_moe_layer(cu::DeviceArena& arena,
                            const cu::Stream& s,
                            cu::Blas& blas,
                            const Limits& lim) {
    const int n_tok = 8192;
    MoeLayer m(arena, s);
    const cu::MoePlan plan = cu::moe_plan(n_tok, m.k, m.E, m.d, m.inter);
    Tensor x = random_filled(arena, s, DType::bf16, {n_tok, m.d}, 1.0f, 18);
    Tensor logits = random_filled(arena, s, DType::f32, {n_tok, m.E}, 1.0f, 19);
    Tensor idx = arena.tensor(DType::i32, {n_tok, m.k});
    Tensor weight = arena.tensor(DType::f32, {n_tok, m.k});
    Tensor h = arena.tensor(DType::bf16, {plan.n_assign, m.inter});
    Tensor out = arena.tensor(DType::bf16, {plan.n_assign, m.d});
    Tensor y = arena.tensor(DType::f32, {n_tok, m.d});
    void* scratch = arena.allocate(static_cast<size_t>(plan.scratch_bytes));
    const cu::MoeDispatch disp = cu::moe_dispatch_arrays(plan, n_tok, m.k, m.E, scratch);
    const cu::MoeRouteParams rp = m.route(n_tok, logits, idx, weight);
    const cu::MoeExpertParams ep = m.experts(x, h, out);
    const double route = best_seconds(s, 5, [&] {
        cu::moe_route(s, rp);
        cu::moe_dispatch_plan(s, plan, idx.ptr<int32_t>(), disp);
    });
    const double gemms = best_seconds(s, 5, [&] { cu::moe_experts(s, plan, disp, ep); });
    const double combine = best_seconds(s, 5, [&] {
        cu::moe_combine(s, disp, out.data, weight.ptr<float>(), m.d, DType::f32, y.data, false);
    });
    const double layer = best_seconds(s, 5, [&] {
        cu::moe_route(s, rp);
        cu::moe_dispatch_plan(s, plan, idx.ptr<int32_t>(), disp);
        cu::moe_experts(s, plan, disp, ep);
        cu::moe_combine(s, disp, out.data, weight.ptr<float>(), m.d, DType::f32, y.data, false);
    });
    const double flops = 6.0 * static_cast<double>(plan.n_assign) * m.d * m.inter;
    std::printf(
        "  moe layer Kimi-Linear-48B experts, %d tokens: %.2f ms (route + plan %.3f, GEMMs"
        " %.2f, combine %.3f), MFU %.3f (GEMMs alone %.3f) of the bf16 peak\n",
        n_tok,
        layer * 1e3,
        route * 1e3,
        gemms * 1e3,
        combine * 1e3,
        flops / 1e12 / layer / lim.peak_tflops,
        flops / 1e12 / gemms / lim.peak_tflops);
    // cuBLAS's grouped GEMM on the same rows: gate, up and down, one launch each
    std::vector<int32_t> offset(static_cast<size_t>(m.E) + 1);
    cu::copy_to_host(offset.data(), disp.offset, offset.size() * sizeof(int32_t), s);
    s.synchronize();
    std::vector<int64_t> rows(static_cast<size_t>(m.E));
    for (int e = 0; e < m.E; ++e)
        rows[static_cast<size_t>(e)] =
            offset[static_cast<size_t>(e) + 1] - offset[static_cast<size_t>(e)];
    Tensor x_rows = random_filled(arena, s, DType::bf16, {plan.n_assign, m.d}, 1.0f, 20);
    Tensor up = arena.tensor(DType::bf16, {plan.n_assign, m.inter});
    const double cublas = best_seconds(s, 3, [&] {
        blas.grouped_linear(x_rows, m.w1, rows, h);
        blas.grouped_linear(x_rows, m.w3, rows, up);
        blas.grouped_linear(h, m.w2, rows, out);
    });
    std::printf(
        "  moe layer cuBLAS grouped GEMMs on the same rows: %.2f ms, MFU %.3f (fused GEMMs"
        " %.2fx its time)\n",
        cublas * 1e3,
        flops / 1e12 / cublas / lim.peak_tflops,
        gemms / cublas);
    arena.free(scratch);
    release(arena, {&x, &logits, &idx, &weight, &h, &out, &y, &x_rows, &up});
    m.free(arena);
}

// The decode step of bench_decode_graph: 27 layers sharing one set of weights (their bytes are
// read from HBM every layer all the same: 3.6 GB of experts do not fit in L2).
struct DecodeStep {
    static constexpr int kLayers = 27, D = 4096, H = 32, K = 128;
    int max_batch;
    MoeLayer moe;
    Tensor norm, wq, wk, wv, wo, wg;
    Tensor x, xn, q, k, v, g, beta, o, attn, logits, idx, weight, h, out, S;
    void* scratch;
    DecodeStep(cu::DeviceArena& arena, const cu::Stream& s, int max_b)
        : max_batch(max_b), moe(arena, s) {
        const int d = moe.d;
        norm = filled(arena, s, DType::bf16, {d}, 1.0f);
        wq = random_filled(arena, s, DType::bf16, {D, d}, 0.02f, 21);
        wk = random_filled(arena, s, DType::bf16, {D, d}, 0.02f, 22);
        wv = random_filled(arena, s, DType::bf16, {D, d}, 0.02f, 23);
        wo = random_filled(arena, s, DType::bf16, {d, D}, 0.02f, 24);
        wg = random_filled(arena, s, DType::bf16, {moe.E, d}, 0.02f, 25);
        x = random_filled(arena, s, DType::bf16, {max_b, d}, 1.0f, 26);
        xn = arena.tensor(DType::bf16, {max_b, d});
        q = arena.tensor(DType::bf16, {max_b, D});
        k = arena.tensor(DType::bf16, {max_b, D});
        v = arena.tensor(DType::bf16, {max_b, D});
        g = filled(arena, s, DType::f32, {max_b, D}, -0.02f);
        beta = filled(arena, s, DType::f32, {max_b, H}, 0.5f);
        o = arena.tensor(DType::bf16, {max_b, D});
        attn = arena.tensor(DType::bf16, {max_b, d});
        logits = arena.tensor(DType::f32, {max_b, moe.E});
        idx = arena.tensor(DType::i32, {max_b, moe.k});
        weight = arena.tensor(DType::f32, {max_b, moe.k});
        h = arena.tensor(DType::bf16, {int64_t{max_b} * moe.k, moe.inter});
        out = arena.tensor(DType::bf16, {int64_t{max_b} * moe.k, d});
        S = filled(arena, s, DType::f32, {max_b, H, K, K}, 0.0f);
        scratch = arena.allocate(
            static_cast<size_t>(cu::moe_plan(max_b, moe.k, moe.E, d, moe.inter).scratch_bytes));
    }
    void free(cu::DeviceArena& arena) {
        release(arena, {&norm, &wq,   &wk, &wv,   &wo,     &wg,  &x,      &xn, &q,   &k, &v,
                        &g,    &beta, &o,  &attn, &logits, &idx, &weight, &h,  &out, &S});
        arena.free(scratch);
        moe.free(arena);
    }
    // One decode token of b sequences through every layer.
    void run(const cu::Stream& s, cu::Blas& blas, int b) {
        const cu::MoePlan plan = cu::moe_plan(b, moe.k, moe.E, moe.d, moe.inter);
        const cu::MoeDispatch disp = cu::moe_dispatch_arrays(plan, b, moe.k, moe.E, scratch);
        Tensor xb = x.rows(0, b), xnb = xn.rows(0, b), qb = q.rows(0, b), kb = k.rows(0, b);
        Tensor vb = v.rows(0, b), ob = o.rows(0, b), ab = attn.rows(0, b), lb = logits.rows(0, b);
        Tensor ib = idx.rows(0, b), wb = weight.rows(0, b);
        cu::KdaBatchParams p;
        p.n_seq = b;
        p.n_head = H;
        p.d_k = K;
        p.d_v = K;
        p.dtype = DType::bf16;
        p.q = q.data;
        p.k = k.data;
        p.v = v.data;
        p.g = g.ptr<float>();
        p.beta = beta.ptr<float>();
        p.S = S.ptr<float>();
        p.o = o.data;
        const cu::MoeRouteParams rp = moe.route(b, lb, ib, wb);
        const cu::MoeExpertParams ep = moe.experts(xn, h, out);
        for (int layer = 0; layer < kLayers; ++layer) {
            cu::rms_norm(s, xb, norm, 1e-5f, xnb);
            blas.linear(xnb, wq, qb);
            blas.linear(xnb, wk, kb);
            blas.linear(xnb, wv, vb);
            cu::kda_decode_step(s, p);
            blas.linear(ob, wo, ab);
            cu::add_inplace(s, xb, ab);
            cu::rms_norm(s, xb, norm, 1e-5f, xnb);
            blas.linear(xnb, wg, lb);
            cu::moe_route(s, rp);
            cu::moe_dispatch_plan(s, plan, idx.ptr<int32_t>(), disp);
            cu::moe_experts(s, plan, disp, ep);
            cu::moe_combine(
                s, disp, out.data, weight.ptr<float>(), moe.d, DType::bf16, x.data, true);
        }
    }
};

inline void bench_decode_graph(cu::DeviceArena& arena, const cu::Stream& s, cu::Blas& blas) {
    DecodeStep step(arena, s, 64);
    cu::DecodeGraphs graphs(cu::DecodeBuckets({1, 8, 64}),
                            [&](const cu::Stream& st, int b) { step.run(st, blas, b); });
    for (int b : {1, 8, 64}) {
        const double eager = best_seconds(s, 5, [&] { step.run(s, blas, b); });
        const double graph = best_seconds(s, 5, [&] { graphs.run(s, b); });
        std::printf(
            "  decode    27 layers at Kimi-Linear sizes, batch %d: eager %.0f us, graph replay"
            " %.0f us (%.2fx)\n",
            b,
            eager * 1e6,
            graph * 1e6,
            eager / graph);
    }
    step.free(arena);
}

}  // namespace hymoe::bench
