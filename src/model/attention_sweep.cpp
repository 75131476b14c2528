// The fresh sequences' expanded attention on a Ctx (attention_sweep.h): the forward recomputed
// from x (mla_project, the indexer's inputs, W_kvb c_kv, the sweep for o, the gate) and the
// sweep's backward. Per sequence, block and head, in ops on the Ctx (backend/ops_strided.h):
//   P = softmax(τ Q Kᵀ + mask),  o = P V;  backward, from dO:
//   dV += Pᵀ dO,  dS = P ⊙ (dO Vᵀ − rowsum(P ⊙ dO Vᵀ)),  dQ = τ dS K,  dK += τ dSᵀ Q,
// then dK_h = [dk_n,h | dk_r,h] into dkvb's k_n columns and Σ_h into dk_r, dV_h into v's. The
// probabilities are computed in the forward and again in the backward, block by block, so scratch
// stays [block, n_k]. On the CPU every product, copy and softmax runs on the host pointers the
// block's former host loops used, bit for bit.
#include "attention_sweep.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "hymoe/backend/ops.h"
#include "hymoe/backend/ops_attention.h"
#include "hymoe/backend/ops_backward.h"
#include "hymoe/backend/ops_rows.h"
#include "hymoe/backend/ops_strided.h"
#include "hymoe/core/error.h"

namespace hymoe::model::detail {

namespace {

using backend::Scratch;

constexpr int64_t query_block = 256;  // queries per block of scores, as the CPU forward's

// One sequence's keys and values per head, in the sequence's scratch.
struct SeqKv {
    std::vector<Tensor> k;  // [H] × [n_s, d_n+d_r]  [k_n,h | k_r]
    std::vector<Tensor> v;  // [H] × [n_s, d_v]
};

SeqKv seq_kv(const FreshCall& c, Scratch& s, const FreshActs& a, int64_t row0, int64_t n_s) {
    const MlaDims m = mla_dims(c.cfg);
    const int64_t ld = m.n_head * m.d_kvb();  // kvb's row
    SeqKv kv;
    for (int64_t h = 0; h < m.n_head; ++h) {
        kv.k.push_back(s(DType::f32, {n_s, m.d_qk()}));
        kv.v.push_back(s(DType::f32, {n_s, m.d_v}));
        const int64_t at = row0 * ld + h * m.d_kvb();  // k_n,h of the sequence's first row
        ops::copy_block(c.ctx, n_s, m.d_n, {a.kvb, at, ld}, {kv.k[h], 0, m.d_qk()});
        ops::copy_block(
            c.ctx, n_s, m.d_r, {a.p.k_r, row0 * m.d_r, m.d_r}, {kv.k[h], m.d_n, m.d_qk()});
        ops::copy_block(c.ctx, n_s, m.d_v, {a.kvb, at + m.d_n, ld}, {kv.v[h], 0, m.d_v});
    }
    return kv;
}

// DSA: the mask [n_b, n_kb = i0 + n_b] of the sequence's (first row row0) query block [i0, i0 +
// n_b): 0 at each query's top-k keys by the indexer score, −inf elsewhere.
void dsa_mask(const FreshCall& c, const FreshActs& a, int64_t row0, int64_t i0, Tensor& mask) {
    const int64_t n_b = mask.dim(0), n_kb = mask.dim(1);
    Scratch s(c.ctx);
    Tensor scores = s(DType::f32, {n_b, n_kb});
    ops::indexer_scores(c.ctx,
                        a.q_idx.rows(row0 + i0, n_b),
                        a.w_idx.rows(row0 + i0, n_b),
                        a.k_idx.rows(row0, n_kb),
                        scores);
    if (c.tp != nullptr && c.tp->size() > 1) {
        ops::synchronize(c.ctx);          // the collective runs outside ctx's stream
        comm::all_reduce(scores, *c.tp);  // Σ over every rank's heads
    }
    ops::indexer_mask(c.ctx, scores, i0, c.cfg.indexer.top_k, mask);
}

// Calls f(h, i0, p) for every query block [i0, i0 + n_b) and head h of the sequence at rows
// [row0, row0 + n_s), with p [n_b, n_kb = i0 + n_b] = softmax(τ q_h k_hᵀ + mask) in fp32.
template <typename F>
void for_each_block(
    const FreshCall& c, const FreshActs& a, const SeqKv& kv, int64_t row0, int64_t n_s, F&& f) {
    const MlaDims m = mla_dims(c.cfg);
    const float tau = static_cast<float>(mla_softmax_scale(c.cfg.mla));
    const int64_t ld_q = m.n_head * m.d_qk();
    for (int64_t i0 = 0; i0 < n_s; i0 += query_block) {
        const int64_t n_b = std::min(query_block, n_s - i0), n_kb = i0 + n_b;
        Scratch s(c.ctx);
        Tensor mask;  // dsa
        if (c.dsa()) {
            mask = s(DType::f32, {n_b, n_kb});
            dsa_mask(c, a, row0, i0, mask);
        }
        Tensor p = s(DType::f32, {n_b, n_kb});
        for (int64_t h = 0; h < m.n_head; ++h) {
            ops::gemm(c.ctx,
                      false,
                      true,
                      n_b,
                      n_kb,
                      m.d_qk(),
                      tau,
                      {a.p.q, (row0 + i0) * ld_q + h * m.d_qk(), ld_q},
                      {kv.k[h], 0, m.d_qk()},
                      0.0f,
                      {p, 0, n_kb});
            ops::causal_softmax(c.ctx, p, i0, c.dsa() ? &mask : nullptr);
            f(h, i0, p);
        }
    }
}

}  // namespace

void check_fresh(const char* what,
                 const ModelConfig& cfg,
                 const LayerSpec& spec,
                 const MlaWeightViews& w,
                 const Tensor& x,
                 const AttnBatchViews& b,
                 const Tensor* dy,
                 const Tensor* dx) {
    const MlaDims m = mla_dims(cfg);
    HYMOE_CHECK(spec.mixer == Mixer::mla || spec.mixer == Mixer::dsa,
                what,
                " on a ",
                to_string(spec.mixer),
                " layer");
    HYMOE_CHECK(b.batch != nullptr, what, ": no batch");
    const SeqBatch& batch = *b.batch;
    const Shape shape{batch.n_tok(), m.d};
    HYMOE_CHECK(x.shape == shape && (dy == nullptr || dy->shape == shape) &&
                    (dx == nullptr || dx->shape == shape),
                what,
                ": x ",
                shape_string(x.shape),
                dy ? " and its gradients " : "",
                dy ? shape_string(dy->shape) : "",
                dx ? shape_string(dx->shape) : "",
                " for ",
                batch.n_tok(),
                " tokens of width ",
                m.d);
    HYMOE_CHECK(
        b.pos.data == nullptr || (b.pos.dtype == DType::i64 && b.pos.shape == Shape{batch.n_tok()}),
        what,
        ": positions ",
        to_string(b.pos.dtype),
        shape_string(b.pos.shape),
        " for ",
        batch.n_tok(),
        " tokens");
    for (int64_t s = 0; s < batch.n_seq(); ++s)
        HYMOE_CHECK(batch.pos0[s] == 0,
                    what,
                    ": sequence ",
                    s,
                    " starts at ",
                    batch.pos0[s],
                    "; only sequences that start fresh");
    HYMOE_CHECK(w.lora_views.k.empty() && w.lora_views.v.empty(),
                what,
                ": LoRA factors on k or v, projections an MLA/DSA block lacks");
    if (spec.mixer == Mixer::dsa)
        HYMOE_CHECK(m.r_q > 0 && cfg.indexer.top_k > 0,
                    what,
                    ": DSA needs a query latent (q_lora_rank ",
                    m.r_q,
                    ") and top-k > 0 (",
                    cfg.indexer.top_k,
                    ")");
}

Tensor fresh_positions(const backend::Ctx& ctx, Scratch& scratch, const AttnBatchViews& b) {
    if (b.pos.data != nullptr)
        return b.pos;
    const SeqBatch& batch = *b.batch;
    std::vector<int64_t> pos(static_cast<size_t>(batch.n_tok()));  // every sequence from 0
    for (int64_t s = 0; s < batch.n_seq(); ++s)
        for (int64_t t = batch.offsets[s]; t < batch.offsets[s + 1]; ++t)
            pos[t] = t - batch.offsets[s];
    Tensor out = scratch(DType::i64, {batch.n_tok()});
    ops::upload(ctx, Tensor{pos.data(), DType::i64, Device::cpu, {batch.n_tok()}}, out);
    return out;
}

FreshActs fresh_forward(const FreshCall& c,
                        Scratch& scratch,
                        const MlaWeightViews& w,
                        const Tensor& x) {
    const MlaDims m = mla_dims(c.cfg);
    const int64_t n_tok = x.dim(0), ld_o = m.n_head * m.d_v;
    auto f32 = [&](Shape shape) { return scratch(DType::f32, std::move(shape)); };
    FreshActs a;
    a.p.q = f32({n_tok, m.n_head * m.d_qk()});
    a.p.c_kv = f32({n_tok, m.r_kv});
    a.p.k_r = f32({n_tok, m.d_r});
    a.p.a_kv = f32({n_tok, m.r_kv});
    if (m.r_q > 0) {
        a.p.c_q = f32({n_tok, m.r_q});
        a.p.a_q = f32({n_tok, m.r_q});
    }
    mla_project(c.ctx, c.cfg, w, x, c.batch, c.pos, a.p);
    if (c.dsa()) {
        const int64_t h_i = c.cfg.indexer.n_head, d_i = c.cfg.indexer.head_dim;
        a.q_idx = f32({n_tok, h_i * d_i});
        a.k_idx = f32({n_tok, d_i});
        a.w_idx = f32({n_tok, h_i});
        indexer_project(c.ctx, c.cfg, w.indexer, x, a.p.c_q, c.pos, a.q_idx, a.k_idx, a.w_idx);
    }
    a.kvb = f32({n_tok, m.n_head * m.d_kvb()});
    ops::linear(c.ctx, a.p.c_kv, w.kv_b_proj, a.kvb);
    a.o = f32({n_tok, ld_o});
    if (c.spec.gated)
        a.g = f32({n_tok, ld_o});
    for (int64_t s = 0; s < c.batch.n_seq(); ++s) {
        const int64_t row0 = c.batch.offsets[s], n_s = c.batch.length(s);
        if (n_s == 0)
            continue;
        Scratch seq(c.ctx);
        const SeqKv kv = seq_kv(c, seq, a, row0, n_s);
        for_each_block(c, a, kv, row0, n_s, [&](int64_t h, int64_t i0, const Tensor& p) {
            const int64_t n_b = p.dim(0), n_kb = p.dim(1);
            ops::gemm(c.ctx,  // o_h [n_b, d_v] = p v_h
                      false,
                      false,
                      n_b,
                      m.d_v,
                      n_kb,
                      1.0f,
                      {p, 0, n_kb},
                      {kv.v[h], 0, m.d_v},
                      0.0f,
                      {a.o, (row0 + i0) * ld_o + h * m.d_v, ld_o});
        });
    }
    if (c.spec.gated) {
        ops::linear(c.ctx, x, w.g_proj, a.g);
        ops::sigmoid_inplace(c.ctx, a.g);
    }
    return a;
}

void attend_backward(const FreshCall& c,
                     const FreshActs& a,
                     const Tensor& d_o,
                     Tensor& dq,
                     Tensor& dkvb,
                     Tensor& dk_r) {
    const MlaDims m = mla_dims(c.cfg);
    const float tau = static_cast<float>(mla_softmax_scale(c.cfg.mla));
    const int64_t ld_q = m.n_head * m.d_qk(), ld_o = m.n_head * m.d_v;
    const int64_t ld_kvb = m.n_head * m.d_kvb();
    for (int64_t s = 0; s < c.batch.n_seq(); ++s) {
        const int64_t row0 = c.batch.offsets[s], n_s = c.batch.length(s);
        if (n_s == 0)
            continue;
        Scratch seq(c.ctx);
        const SeqKv kv = seq_kv(c, seq, a, row0, n_s);
        std::vector<Tensor> dk, dv;  // [H] × [n_s, d_n+d_r], [n_s, d_v]: summed over blocks
        for (int64_t h = 0; h < m.n_head; ++h) {
            dk.push_back(seq(DType::f32, {n_s, m.d_qk()}));
            dv.push_back(seq(DType::f32, {n_s, m.d_v}));
            ops::fill_zero(c.ctx, dk.back());
            ops::fill_zero(c.ctx, dv.back());
        }
        for_each_block(c, a, kv, row0, n_s, [&](int64_t h, int64_t i0, const Tensor& p) {
            const int64_t n_b = p.dim(0), n_kb = p.dim(1);
            const ops::MatRef q_b{a.p.q, (row0 + i0) * ld_q + h * m.d_qk(), ld_q};
            const ops::MatRef do_b{d_o, (row0 + i0) * ld_o + h * m.d_v, ld_o};
            Scratch sb(c.ctx);
            Tensor ds = sb(DType::f32, {n_b, n_kb});  // dP, then dS
            // dP = dO v_hᵀ;  dv_h += pᵀ dO
            ops::gemm(c.ctx,
                      false,
                      true,
                      n_b,
                      n_kb,
                      m.d_v,
                      1.0f,
                      do_b,
                      {kv.v[h], 0, m.d_v},
                      0.0f,
                      {ds, 0, n_kb});
            ops::gemm(c.ctx,
                      true,
                      false,
                      n_kb,
                      m.d_v,
                      n_b,
                      1.0f,
                      {p, 0, n_kb},
                      do_b,
                      1.0f,
                      {dv[h], 0, m.d_v});
            ops::softmax_rows_backward(c.ctx, p, ds);  // dS (w.r.t. the scaled scores)
            // dq = τ dS k_h (this block's rows: written once);  dk_h += τ dSᵀ q
            ops::gemm(c.ctx,
                      false,
                      false,
                      n_b,
                      m.d_qk(),
                      n_kb,
                      tau,
                      {ds, 0, n_kb},
                      {kv.k[h], 0, m.d_qk()},
                      0.0f,
                      {dq, (row0 + i0) * ld_q + h * m.d_qk(), ld_q});
            ops::gemm(c.ctx,
                      true,
                      false,
                      n_kb,
                      m.d_qk(),
                      n_b,
                      tau,
                      {ds, 0, n_kb},
                      q_b,
                      1.0f,
                      {dk[h], 0, m.d_qk()});
        });
        // scatter: dk_h = [dk_n,h | dk_r,h] → dkvb's k_n columns and Σ_h into dk_r; dv_h → v's
        Tensor dk_r_s = dk_r.rows(row0, n_s);
        Tensor part = seq(DType::f32, {n_s, m.d_r});  // dk_r,h
        ops::fill_zero(c.ctx, dk_r_s);
        for (int64_t h = 0; h < m.n_head; ++h) {
            const int64_t at = row0 * ld_kvb + h * m.d_kvb();
            ops::copy_block(c.ctx, n_s, m.d_n, {dk[h], 0, m.d_qk()}, {dkvb, at, ld_kvb});
            ops::copy_block(c.ctx, n_s, m.d_r, {dk[h], m.d_n, m.d_qk()}, {part, 0, m.d_r});
            ops::add_inplace(c.ctx, dk_r_s, part);
            ops::copy_block(c.ctx, n_s, m.d_v, {dv[h], 0, m.d_v}, {dkvb, at + m.d_n, ld_kvb});
        }
    }
}

}  // namespace hymoe::model::detail
