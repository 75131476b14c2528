// Backward of the MLA / DSA / gated attention layer (spec/model-math.md §4, §5, §9) in the expanded
// (MHA) form, for sequences that start fresh (pos0 = 0, no cache: the training case). The forward
// is recomputed from x (mla_project, the indexer's top-k mask, the gate), then, with u = o ⊙ σ(z),
// z = W_g x (u = o ungated):
//   y = W_o u (+ o's adapter):   du = dy W_o (+ adapter)
//   gate:                        do = du ⊙ σ(z), dz = du ⊙ o ⊙ σ(z)(1 − σ(z)), dx += dz W_g
//   per sequence, head h, query block: P = softmax(τ Q Kᵀ + mask),
//     dV += Pᵀ dO, dS = P ⊙ (dO Vᵀ − rowsum(P ⊙ dO Vᵀ)), dQ = τ dS K, dK += τ dSᵀ Q
//   K_h = [k_n,h | k_r] with k_r shared by the heads: dk_r = Σ_h dK_h[:, d_n:]
//   [k_n | v]_h = (W_kvb c_kv)_h, c_kv = RMSNorm(a_kv), q_r and k_r rotated (RoPE backward),
//   dx += d[a_kv | k_r] W_kva (+ kv's adapter) + the query path (W_qb, q_a_layernorm, W_qa, or
//   W_q without a latent, + q's adapter).
// The indexer's mask is recomputed and held constant: the indexer gets no gradient (its input is
// detached by design). Softmax probabilities are computed twice, once for o (which the gate and
// o's adapter need before dO exists) and once in the backward sweep, block by block as in the
// forward, so scratch stays [block, n_k]. Rule (llm.c): dx is overwritten, adapter gradients
// accumulate. The block's elementwise and norm backwards, its products with the weights and the
// RoPE backward are ops on the caller's Ctx (backend/ops_backward.h); the recompute, the
// per-sequence sweep (keys and values gathered per head, the masks, the scatter into dkvb) and the
// host adapters still read host pointers, so the Ctx must be the CPU's (one check, in
// attention_backward).
#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "hymoe/backend/ops.h"
#include "hymoe/backend/ops_attention.h"
#include "hymoe/backend/ops_backward.h"
#include "hymoe/backend/ops_kda.h"
#include "hymoe/core/error.h"
#include "hymoe/model/attention.h"
#include "hymoe/model/attention_views.h"
#include "hymoe/model/lora.h"
#include "mla_project.h"

namespace hymoe::model {

namespace {

using detail::mla_dims;
using detail::MlaDims;

constexpr int64_t query_block = 256;  // queries per block of scores, as in the forward

// A view of host fp32 memory (read-only where the pointer is const: the view type is not).
Tensor view_of(const float* p, Shape shape) {
    return Tensor{const_cast<float*>(p), DType::f32, Device::cpu, std::move(shape)};
}

// The recomputed forward: what the backward reads.
struct Recomputed {
    detail::Projected p;             // a_q, c_q, q (rotated), a_kv, c_kv, k_r (rotated)
    IndexerInputs idx;               // dsa only
    Buffer kvb;                      // [n_tok, H·(d_n+d_v)] per head [k_n | v]
    Buffer o;                        // [n_tok, H·d_v]       attention output, before the gate
    Buffer g;                        // [n_tok, H·d_v]       σ(W_g x) (gated only)
    const comm::Comm* tp = nullptr;  // indexer heads split over tp: its scores are all-reduced
};

// One sequence's keys and values per head.
struct SeqKv {
    std::vector<Buffer> k;  // [H] × [n_s, d_n+d_r]  [k_n,h | k_r]
    std::vector<Buffer> v;  // [H] × [n_s, d_v]
};

SeqKv seq_kv(const MlaDims& m, const Recomputed& rc, int64_t row0, int64_t n_s) {
    SeqKv kv;
    for (int64_t h = 0; h < m.n_head; ++h) {
        kv.k.emplace_back(DType::f32, Shape{n_s, m.d_qk()});
        kv.v.emplace_back(DType::f32, Shape{n_s, m.d_v});
        for (int64_t u = 0; u < n_s; ++u) {
            const float* kvb_u = rc.kvb.ptr<float>() + ((row0 + u) * m.n_head + h) * m.d_kvb();
            float* k_u = kv.k[h].ptr<float>() + u * m.d_qk();
            std::copy_n(kvb_u, m.d_n, k_u);
            std::copy_n(rc.p.k_r.ptr<float>() + (row0 + u) * m.d_r, m.d_r, k_u + m.d_n);
            std::copy_n(kvb_u + m.d_n, m.d_v, kv.v[h].ptr<float>() + u * m.d_v);
        }
    }
    return kv;
}

// The mask of a sequence's query block [i0, i0 + n_b) over its n_kb = i0 + n_b visible keys:
// causal, or (dsa) each query's top-k keys by the indexer score.
void block_mask(const ModelConfig& cfg,
                const Recomputed& rc,
                bool dsa,
                int64_t row0,  // the sequence's first row
                int64_t i0,
                Tensor& mask) {  // [n_b, n_kb]
    const int64_t n_b = mask.dim(0), n_kb = mask.dim(1);
    if (!dsa) {
        float* mp = mask.ptr<float>();
        for (int64_t i = 0; i < n_b; ++i)
            for (int64_t u = 0; u < n_kb; ++u)
                mp[i * n_kb + u] = u <= i0 + i ? 0.0f : -std::numeric_limits<float>::infinity();
        return;
    }
    const int64_t h_i = cfg.indexer.n_head, d_i = cfg.indexer.head_dim;
    Buffer scores(DType::f32, {n_b, n_kb});
    ops::indexer_scores(view_of(rc.idx.q.ptr<float>() + (row0 + i0) * h_i * d_i, {n_b, h_i * d_i}),
                        view_of(rc.idx.w.ptr<float>() + (row0 + i0) * h_i, {n_b, h_i}),
                        view_of(rc.idx.k.ptr<float>() + row0 * d_i, {n_kb, d_i}),
                        scores.view());
    if (rc.tp != nullptr && rc.tp->size() > 1)
        comm::all_reduce(scores.view(), *rc.tp);  // Σ over every rank's heads
    ops::indexer_mask(scores.view(), i0, cfg.indexer.top_k, mask);
}

// Calls f(h, i0, p) for every query block [i0, i0 + n_b) and head h of the sequence at rows
// [row0, row0 + n_s), with p [n_b, n_kb = i0 + n_b] = softmax(τ q_h k_hᵀ + mask) in fp32.
template <typename F>
void for_each_block(const ModelConfig& cfg,
                    const Recomputed& rc,
                    bool dsa,
                    const SeqKv& kv,
                    int64_t row0,
                    int64_t n_s,
                    F&& f) {
    const MlaDims m = mla_dims(cfg);
    const float tau = static_cast<float>(mla_softmax_scale(cfg.mla));
    const int64_t ld_q = m.n_head * m.d_qk();
    for (int64_t i0 = 0; i0 < n_s; i0 += query_block) {
        const int64_t n_b = std::min(query_block, n_s - i0), n_kb = i0 + n_b;
        Buffer mask(DType::f32, {n_b, n_kb}), p(DType::f32, {n_b, n_kb});
        block_mask(cfg, rc, dsa, row0, i0, mask.view());
        for (int64_t h = 0; h < m.n_head; ++h) {
            ops::gemm(false,
                      true,
                      n_b,
                      n_kb,
                      m.d_qk(),
                      tau,
                      rc.p.q.ptr<float>() + (row0 + i0) * ld_q + h * m.d_qk(),
                      ld_q,
                      kv.k[h].ptr<float>(),
                      m.d_qk(),
                      0.0f,
                      p.ptr<float>(),
                      n_kb);
            ops::add_inplace(p.view(), mask.view());
            ops::softmax_rows(p.ptr<float>(), n_b, n_kb);
            f(h, i0, p.view());
        }
    }
}

Recomputed recompute(const ModelConfig& cfg,
                     const LayerSpec& spec,
                     const MlaWeights& w,
                     const Tensor& x,
                     const SeqBatch& batch,
                     const std::vector<int64_t>& pos,
                     const comm::Comm* tp) {
    const MlaDims m = mla_dims(cfg);
    const int64_t n_tok = x.dim(0), ld_o = m.n_head * m.d_v;
    const bool dsa = spec.mixer == Mixer::dsa;
    Recomputed rc;
    rc.tp = tp;
    rc.p = detail::mla_project(cfg, w, x, batch, pos, true);
    if (dsa)
        rc.idx = indexer_project(cfg, w.indexer, x, rc.p.c_q.view(), pos);
    rc.kvb = Buffer(DType::f32, {n_tok, m.n_head * m.d_kvb()});
    ops::linear(rc.p.c_kv.view(), w.kv_b_proj.view(), rc.kvb.view());
    rc.o = Buffer(DType::f32, {n_tok, ld_o});
    for (int64_t s = 0; s < batch.n_seq(); ++s) {
        const int64_t row0 = batch.offsets[s], n_s = batch.length(s);
        const SeqKv kv = seq_kv(m, rc, row0, n_s);
        for_each_block(cfg, rc, dsa, kv, row0, n_s, [&](int64_t h, int64_t i0, const Tensor& p) {
            const int64_t n_b = p.dim(0), n_kb = p.dim(1);
            ops::gemm(false,  // o_h [n_b, d_v] = p v_h
                      false,
                      n_b,
                      m.d_v,
                      n_kb,
                      1.0f,
                      p.ptr<float>(),
                      n_kb,
                      kv.v[h].ptr<float>(),
                      m.d_v,
                      0.0f,
                      rc.o.ptr<float>() + (row0 + i0) * ld_o + h * m.d_v,
                      ld_o);
        });
    }
    if (spec.gated) {
        rc.g = Buffer(DType::f32, {n_tok, ld_o});
        ops::linear(x, w.g_proj.view(), rc.g.view());
        ops::sigmoid_inplace(rc.g.view());
    }
    return rc;
}

// The attention sweep backward: from d_o [n_tok, H·d_v], dq [n_tok, H·(d_n+d_r)] (of the rotated
// q), dkvb [n_tok, H·(d_n+d_v)] and dk_r [n_tok, d_r] (of the rotated k_r), all overwritten.
void attend_backward(const backend::Ctx& ctx,
                     const ModelConfig& cfg,
                     const Recomputed& rc,
                     bool dsa,
                     const SeqBatch& batch,
                     const Buffer& d_o,
                     Buffer& dq,
                     Buffer& dkvb,
                     Buffer& dk_r) {
    const MlaDims m = mla_dims(cfg);
    const float tau = static_cast<float>(mla_softmax_scale(cfg.mla));
    const int64_t ld_q = m.n_head * m.d_qk(), ld_o = m.n_head * m.d_v;
    for (int64_t s = 0; s < batch.n_seq(); ++s) {
        const int64_t row0 = batch.offsets[s], n_s = batch.length(s);
        const SeqKv kv = seq_kv(m, rc, row0, n_s);
        std::vector<Buffer> dk, dv;  // [H] × [n_s, d_n+d_r], [n_s, d_v]: summed over blocks
        for (int64_t h = 0; h < m.n_head; ++h) {
            dk.emplace_back(DType::f32, Shape{n_s, m.d_qk()});
            dv.emplace_back(DType::f32, Shape{n_s, m.d_v});
        }
        for_each_block(cfg, rc, dsa, kv, row0, n_s, [&](int64_t h, int64_t i0, const Tensor& p) {
            const int64_t n_b = p.dim(0), n_kb = p.dim(1);
            const float* pp = p.ptr<float>();
            const float* q_b = rc.p.q.ptr<float>() + (row0 + i0) * ld_q + h * m.d_qk();
            const float* do_b = d_o.ptr<float>() + (row0 + i0) * ld_o + h * m.d_v;
            Buffer ds_buf(DType::f32, {n_b, n_kb});  // [n_b, n_kb] dP, then dS
            float* ds = ds_buf.ptr<float>();
            // dP = dO v_hᵀ;  dv_h += pᵀ dO
            ops::gemm(false,
                      true,
                      n_b,
                      n_kb,
                      m.d_v,
                      1.0f,
                      do_b,
                      ld_o,
                      kv.v[h].ptr<float>(),
                      m.d_v,
                      0.0f,
                      ds,
                      n_kb);
            ops::gemm(true,
                      false,
                      n_kb,
                      m.d_v,
                      n_b,
                      1.0f,
                      pp,
                      n_kb,
                      do_b,
                      ld_o,
                      1.0f,
                      dv[h].ptr<float>(),
                      m.d_v);
            ops::softmax_rows_backward(ctx, p, ds_buf.view());  // dS (w.r.t. the scaled scores)
            // dq = τ dS k_h (this block's rows: written once);  dk_h += τ dSᵀ q
            ops::gemm(false,
                      false,
                      n_b,
                      m.d_qk(),
                      n_kb,
                      tau,
                      ds,
                      n_kb,
                      kv.k[h].ptr<float>(),
                      m.d_qk(),
                      0.0f,
                      dq.ptr<float>() + (row0 + i0) * ld_q + h * m.d_qk(),
                      ld_q);
            ops::gemm(true,
                      false,
                      n_kb,
                      m.d_qk(),
                      n_b,
                      tau,
                      ds,
                      n_kb,
                      q_b,
                      ld_q,
                      1.0f,
                      dk[h].ptr<float>(),
                      m.d_qk());
        });
        // scatter: dk_h = [dk_n,h | dk_r,h] → dkvb's k_n columns and Σ_h into dk_r; dv_h → v's
        std::fill_n(dk_r.ptr<float>() + row0 * m.d_r, n_s * m.d_r, 0.0f);
        for (int64_t h = 0; h < m.n_head; ++h)
            for (int64_t u = 0; u < n_s; ++u) {
                const float* dk_u = dk[h].ptr<float>() + u * m.d_qk();
                float* dkvb_u = dkvb.ptr<float>() + ((row0 + u) * m.n_head + h) * m.d_kvb();
                float* dk_r_u = dk_r.ptr<float>() + (row0 + u) * m.d_r;
                std::copy_n(dk_u, m.d_n, dkvb_u);
                for (int64_t e = 0; e < m.d_r; ++e)
                    dk_r_u[e] += dk_u[m.d_n + e];
                std::copy_n(dv[h].ptr<float>() + u * m.d_v, m.d_v, dkvb_u + m.d_n);
            }
    }
}

void check_call(const ModelConfig& cfg,
                const LayerSpec& spec,
                const Tensor& x,
                const SeqBatch& batch,
                const Tensor& dy,
                const Tensor& dx) {
    const MlaDims m = mla_dims(cfg);
    HYMOE_CHECK(spec.mixer == Mixer::mla || spec.mixer == Mixer::dsa,
                "attention_backward on a ",
                to_string(spec.mixer),
                " layer");
    HYMOE_CHECK(x.shape.size() == 2 && x.dim(0) == batch.n_tok() && x.dim(1) == m.d &&
                    dy.shape == x.shape && dx.shape == x.shape,
                "attention_backward: x ",
                shape_string(x.shape),
                " dy ",
                shape_string(dy.shape),
                " dx ",
                shape_string(dx.shape),
                " for ",
                batch.n_tok(),
                " tokens of width ",
                m.d);
    for (int64_t s = 0; s < batch.n_seq(); ++s)
        HYMOE_CHECK(batch.pos0[s] == 0,
                    "attention_backward: sequence ",
                    s,
                    " starts at ",
                    batch.pos0[s],
                    "; the backward takes only sequences that start fresh");
    if (spec.mixer == Mixer::dsa)
        HYMOE_CHECK(m.r_q > 0 && cfg.indexer.top_k > 0,
                    "attention_backward: DSA needs a query latent (q_lora_rank ",
                    m.r_q,
                    ") and top-k > 0 (",
                    cfg.indexer.top_k,
                    ")");
}

}  // namespace

void attention_backward(const backend::Ctx& ctx,
                        const ModelConfig& cfg,
                        const LayerSpec& spec,
                        const MlaWeights& w,
                        const Tensor& x,
                        const SeqBatch& batch,
                        const Tensor& dy,
                        Tensor& dx,
                        const comm::Comm* tp) {
    check_call(cfg, spec, x, batch, dy, dx);
    HYMOE_CHECK(ctx.device == Device::cpu,
                "attention_backward: the recompute, the per-sequence sweep and the host adapters "
                "run on host pointers so far: a ",
                to_string(ctx.device),
                " context");
    const MlaDims m = mla_dims(cfg);
    const int64_t n_tok = x.dim(0), ld_o = m.n_head * m.d_v;
    const float eps = static_cast<float>(cfg.mla.norm_eps);
    const bool dsa = spec.mixer == Mixer::dsa;
    std::vector<int64_t> pos(static_cast<size_t>(n_tok));  // [n_tok] every sequence from 0
    for (int64_t s = 0; s < batch.n_seq(); ++s)
        for (int64_t t = batch.offsets[s]; t < batch.offsets[s + 1]; ++t)
            pos[t] = t - batch.offsets[s];
    const Recomputed rc = recompute(cfg, spec, w, x, batch, pos, tp);
    std::fill_n(dx.ptr<float>(), dx.numel(), 0.0f);

    // y = W_o u: du [n_tok, H·d_v] = dy W_o (+ o's adapter, whose input is u = o ⊙ σ(z) or o)
    Buffer u(DType::f32, {n_tok, ld_o});
    ops::copy_cols(ctx, rc.o.view(), 0, u.view());
    if (spec.gated)
        ops::mul_inplace(ctx, u.view(), rc.g.view());
    Buffer du(DType::f32, {n_tok, ld_o});
    ops::linear_backward(ctx, dy, w.o_proj.view(), du.view());
    lora_backward(w.lora.o, batch, u.view(), dy, du.view());
    if (spec.gated) {  // do = du ⊙ σ(z) (in du); dz = du ⊙ o ⊙ σ(z)(1 − σ(z)) (in u)
        ops::sigmoid_gate_backward(ctx, du.view(), rc.o.view(), rc.g.view(), u.view());
        ops::linear_backward(ctx, u.view(), w.g_proj.view(), dx, 1.0f);
    }

    Buffer dq(DType::f32, {n_tok, m.n_head * m.d_qk()});
    Buffer dkvb(DType::f32, {n_tok, m.n_head * m.d_kvb()});
    Buffer dk_r(DType::f32, {n_tok, m.d_r});
    attend_backward(ctx, cfg, rc, dsa, batch, du, dq, dkvb, dk_r);
    if (!cfg.mla.nope) {
        const ops::RopeFreqs freqs = mla_rope_freqs(cfg.mla);
        const Tensor pos_t{pos.data(), DType::i64, Device::cpu, {n_tok}};
        ops::rope_backward(ctx, dq.view(), m.d_n, m.n_head, m.d_qk(), pos_t, freqs, true);
        ops::rope_backward(ctx, dk_r.view(), 0, 1, m.d_r, pos_t, freqs, true);
    }

    // latent path: d[a_kv | k_r] [n_tok, r_kv + d_r] → dx through W_kva and kv's adapter
    Buffer dc_kv(DType::f32, {n_tok, m.r_kv});
    ops::linear_backward(ctx, dkvb.view(), w.kv_b_proj.view(), dc_kv.view());
    ops::rms_norm_backward(
        ctx, rc.p.a_kv.view(), w.kv_a_layernorm.view(), eps, dc_kv.view(), dc_kv.view());
    Buffer dkv(DType::f32, {n_tok, m.d_lat()});
    for (int64_t t = 0; t < n_tok; ++t) {
        std::copy_n(dc_kv.ptr<float>() + t * m.r_kv, m.r_kv, dkv.ptr<float>() + t * m.d_lat());
        std::copy_n(
            dk_r.ptr<float>() + t * m.d_r, m.d_r, dkv.ptr<float>() + t * m.d_lat() + m.r_kv);
    }
    ops::linear_backward(ctx, dkv.view(), w.kv_a_proj_with_mqa.view(), dx, 1.0f);
    lora_backward(w.lora.kv, batch, x, dkv.view(), dx);

    // query path
    if (m.r_q > 0) {
        Buffer dc_q(DType::f32, {n_tok, m.r_q});
        ops::linear_backward(ctx, dq.view(), w.q_b_proj.view(), dc_q.view());
        lora_backward(w.lora.q, batch, rc.p.c_q.view(), dq.view(), dc_q.view());
        ops::rms_norm_backward(
            ctx, rc.p.a_q.view(), w.q_a_layernorm.view(), eps, dc_q.view(), dc_q.view());
        ops::linear_backward(ctx, dc_q.view(), w.q_a_proj.view(), dx, 1.0f);
    } else {
        ops::linear_backward(ctx, dq.view(), w.q_proj.view(), dx, 1.0f);
        lora_backward(w.lora.q, batch, x, dq.view(), dx);
    }
}

void attention_backward(const ModelConfig& cfg,
                        const LayerSpec& spec,
                        const MlaWeights& w,
                        const Tensor& x,
                        const SeqBatch& batch,
                        const Tensor& dy,
                        Tensor& dx,
                        const comm::Comm* tp) {
    attention_backward(backend::cpu_ctx(), cfg, spec, w, x, batch, dy, dx, tp);
}

}  // namespace hymoe::model
