// The KDA block's backward (spec/model-math.md §3, §9) over a packed batch of fresh sequences, on
// any Ctx (model/kda_backward_views.h): recompute the forward from x keeping what the backward
// reads (KdaActs), then walk back
//   y = o_proj(on) (+ LoRA o),  on = RMSNorm(o_h; o_norm) ⊙ σ(g_b g_a x),  o = scan(q, k, v, g, β),
//   q = l2(SiLU(conv(q_proj x (+ LoRA q))))·K^{-1/2},  k likewise without the scale,
//   v = SiLU(conv(v_proj x (+ LoRA v))),  g = gate(f_b f_a x + dt_bias),  β = σ(b_proj x),
// summing every path into dx: the q, k, v projections, the decay path (f_a, f_b), β (b_proj) and
// the output gate (g_a, g_b). Every step is an op on the Ctx (backend/ops.h, ops_kda.h,
// ops_kda_backward.h, ops_backward.h), the buffers its scratch. Each sequence's conv starts from
// a zero tail and its recurrence from a zero state (nothing crosses sequences). Only the adapters
// learn: model::lora_backward accumulates (+=) their dA, dB (host slots, factor views with
// gradient views); dx is overwritten.
#include <algorithm>
#include <cmath>

#include "hymoe/backend/ops.h"
#include "hymoe/backend/ops_attention.h"
#include "hymoe/backend/ops_backward.h"
#include "hymoe/backend/ops_kda.h"
#include "hymoe/backend/ops_kda_backward.h"
#include "hymoe/core/error.h"
#include "hymoe/model/kda.h"
#include "hymoe/model/kda_backward_views.h"
#include "kda_dims.h"

namespace hymoe::model {

namespace {

using backend::Ctx;
using backend::Scratch;

// What the backward reads from the forward, recomputed from x (ctx's scratch).
struct KdaActs {
    Tensor cq, ck, cv;                // [n_tok, D] conv outputs, before SiLU
    Tensor q, k, v;                   // [n_tok, D] scan inputs ([n_tok, H, K]; q, k l2-normalised)
    Tensor g;                         // [n_tok, D] log-decay
    Tensor dg_dz;                     // [n_tok, D] ∂g/∂(f + dt_bias)
    Tensor beta;                      // [n_tok, H]
    Tensor o;                         // [n_tok, D] scan output
    Tensor nrm;                       // [n_tok, D] RMSNorm(o_h; o_norm)
    Tensor gate;                      // [n_tok, D] σ(g_b g_a x)
    Tensor on;                        // [n_tok, D] nrm ⊙ gate: o_proj's input
    Tensor ckpt;                      // [Σ_s ⌈T_s/C⌉, H, K, V] states before each chunk
    std::vector<int64_t> ckpt_first;  // [n_seq] sequence s's first checkpoint
};

// One call's context: the Ctx, its scratch, the batch and the dimensions.
struct Call {
    const Ctx& ctx;
    Scratch& scratch;
    const ModelConfig& cfg;
    const KdaWeightViews& w;
    const KdaBatchViews& b;
    ops::KdaSeqTable table;  // b.table, or the batch's rows on ctx's device
    KdaDims n;
    int chunk;
    const SeqBatch& batch() const { return *b.batch; }
    Tensor f32(Shape shape) const { return scratch(DType::f32, std::move(shape)); }
    // A zero tensor of ctx's device (a host zero buffer uploaded).
    Tensor zeros(Shape shape) const {
        Tensor t = f32(shape);
        Buffer host(DType::f32, std::move(shape));
        ops::upload(ctx, host.view(), t);
        return t;
    }
};

// The table the conv's backward reads when the caller gives none: the batch's offsets (and, on
// CUDA, each row's sequence) on ctx's device, in scratch.
ops::KdaSeqTable batch_table(const Ctx& ctx, Scratch& scratch, const SeqBatch& batch) {
    ops::KdaSeqTable t;
    t.n_tok = batch.n_tok();
    t.n_seq = batch.n_seq();
    t.offsets = batch.offsets.data();
    if (ctx.device == Device::cpu)
        return t;
    std::vector<int32_t> row_seq(static_cast<size_t>(t.n_tok));  // [n_tok]
    for (int64_t s = 0; s < t.n_seq; ++s)
        std::fill(row_seq.begin() + batch.offsets[s],
                  row_seq.begin() + batch.offsets[s + 1],
                  static_cast<int32_t>(s));
    Tensor offsets = scratch(DType::i64, {t.n_seq + 1}), rows = scratch(DType::i32, {t.n_tok});
    ops::upload(
        ctx,
        Tensor{const_cast<int64_t*>(batch.offsets.data()), DType::i64, Device::cpu, {t.n_seq + 1}},
        offsets);
    ops::upload(ctx, Tensor{row_seq.data(), DType::i32, Device::cpu, {t.n_tok}}, rows);
    t.offsets = offsets.ptr<int64_t>();
    t.row_seq = rows.ptr<int32_t>();
    return t;
}

Tensor as_shape(const Tensor& t, Shape shape) {
    Tensor r = t;
    r.shape = std::move(shape);
    return r;
}

// c [n_tok, D] = conv(x Wᵀ (+ LoRA)) per sequence from a zero tail, before SiLU.
Tensor project_conv(const Call& c,
                    const Tensor& x,
                    const Tensor& proj,  // [D, d]
                    LoraSlot* slot,
                    const LoraSlotView& factors,
                    const Tensor& conv) {  // [D, 1, W]
    const KdaDims& n = c.n;
    const int64_t n_tok = x.dim(0);
    Tensor u = c.f32({n_tok, n.D});
    ops::linear(c.ctx, x, proj, u);
    lora_forward(c.ctx, slot, factors, c.batch(), c.b.lora_rows, x, u);
    Tensor out = c.f32({n_tok, n.D});
    const Tensor w2 = as_shape(conv, {n.D, n.W});
    for (int64_t s = 0; s < c.batch().n_seq(); ++s) {
        const int64_t r0 = c.batch().offsets[s], T = c.batch().length(s);
        if (T == 0)
            continue;
        Tensor tail = c.zeros({n.W - 1, n.D});  // a fresh sequence
        Tensor cs = out.rows(r0, T);
        ops::causal_conv(c.ctx, u.rows(r0, T), w2, tail, cs);
    }
    return out;
}

// SiLU(c), then l2-normalised per head and scaled when `l2`.
Tensor silu_l2(const Call& c, const Tensor& cv, bool l2, float scale) {
    Tensor out = c.f32(cv.shape);
    ops::kda_silu_l2(c.ctx, cv, c.n.K, l2, scale, out);
    return out;
}

// g and ∂g/∂z from the decay logits z = f_b f_a x + dt_bias (ops::kda_decay_gate_grad).
void decay_gate(const Call& c, const Tensor& x, KdaActs& a) {
    const int64_t n_tok = x.dim(0);
    Tensor low = c.f32({n_tok, c.n.K});
    a.g = c.f32({n_tok, c.n.D});
    a.dg_dz = c.f32({n_tok, c.n.D});
    ops::linear(c.ctx, x, c.w.f_a_proj, low);
    ops::linear(c.ctx, low, c.w.f_b_proj, a.g);
    const auto& lb = c.cfg.kda.gate_lower_bound;
    ops::kda_decay_gate_grad(c.ctx,
                             a.g,
                             c.w.a_log,
                             c.w.dt_bias,
                             lb ? std::optional<float>(static_cast<float>(*lb)) : std::nullopt,
                             a.dg_dz);
}

// Sequence s's scan inputs (rows of a.q, a.k, a.v, a.g, a.beta); state and output left null.
KdaScanParams sequence_scan(const KdaActs& a, const KdaDims& n, const SeqBatch& batch, int64_t s) {
    const int64_t r = batch.offsets[s];
    return {batch.length(s),
            static_cast<int>(n.H),
            static_cast<int>(n.K),
            static_cast<int>(n.K),
            a.q.ptr<float>() + r * n.D,
            a.k.ptr<float>() + r * n.D,
            a.v.ptr<float>() + r * n.D,
            a.g.ptr<float>() + r * n.D,
            a.beta.ptr<float>() + r * n.H,
            nullptr,
            nullptr};
}

// The scan of every sequence from a zero state: a.o and the chunk checkpoints.
void scan_forward(const Call& c, KdaActs& a) {
    const KdaDims& n = c.n;
    const SeqBatch& batch = c.batch();
    a.o = c.f32({a.q.dim(0), n.D});
    a.ckpt_first.resize(static_cast<size_t>(batch.n_seq()));
    int64_t n_ckpt = 0;
    for (int64_t s = 0; s < batch.n_seq(); ++s) {
        a.ckpt_first[static_cast<size_t>(s)] = n_ckpt;
        n_ckpt += std::max<int64_t>(1, (batch.length(s) + c.chunk - 1) / c.chunk);
    }
    a.ckpt = c.f32({n_ckpt, n.H, n.K, n.K});
    const int64_t HKV = n.H * n.K * n.K;
    for (int64_t s = 0; s < batch.n_seq(); ++s) {
        Tensor S = c.zeros({n.H, n.K, n.K});  // a fresh sequence
        KdaScanParams p = sequence_scan(a, n, batch, s);
        p.S = S.ptr<float>();
        p.o = a.o.ptr<float>() + batch.offsets[s] * n.D;
        ops::kda_chunked_checkpoints(
            c.ctx, p, a.ckpt.ptr<float>() + a.ckpt_first[static_cast<size_t>(s)] * HKV, c.chunk);
    }
}

// The forward of kda_forward for fresh sequences, keeping the activations.
KdaActs recompute_forward(const Call& c, const Tensor& x) {
    const KdaDims& n = c.n;
    const KdaWeightViews& w = c.w;
    const LoraSlots none;
    const LoraSlots& host = w.lora ? *w.lora : none;
    const int64_t n_tok = x.dim(0);
    KdaActs a;
    const float scale = 1.0f / std::sqrt(static_cast<float>(n.K));
    a.cq = project_conv(c, x, w.q_proj, host.q, w.lora_views.q, w.q_conv1d);
    a.ck = project_conv(c, x, w.k_proj, host.k, w.lora_views.k, w.k_conv1d);
    a.cv = project_conv(c, x, w.v_proj, host.v, w.lora_views.v, w.v_conv1d);
    a.q = silu_l2(c, a.cq, true, scale);
    a.k = silu_l2(c, a.ck, true, 1.0f);
    a.v = silu_l2(c, a.cv, false, 1.0f);
    decay_gate(c, x, a);
    a.beta = c.f32({n_tok, n.H});
    ops::linear(c.ctx, x, w.b_proj, a.beta);
    ops::sigmoid_inplace(c.ctx, a.beta);
    scan_forward(c, a);

    Tensor low = c.f32({n_tok, n.K});
    a.gate = c.f32({n_tok, n.D});
    ops::linear(c.ctx, x, w.g_a_proj, low);
    ops::linear(c.ctx, low, w.g_b_proj, a.gate);
    ops::sigmoid_inplace(c.ctx, a.gate);
    a.nrm = c.f32({n_tok, n.D});
    Tensor nrm_heads = as_shape(a.nrm, {n_tok * n.H, n.K});
    ops::rms_norm(c.ctx,
                  as_shape(a.o, {n_tok * n.H, n.K}),
                  w.o_norm,
                  static_cast<float>(c.cfg.rms_norm_eps),
                  nrm_heads);
    a.on = c.f32({n_tok, n.D});
    ops::copy_cols(c.ctx, a.nrm, 0, a.on);
    ops::mul_inplace(c.ctx, a.on, a.gate);
    return a;
}

// From dy [n_tok, d] back to dO [n_tok, D], the scan output's gradient; the output gate's path
// (g_a, g_b) is added to dx, the o adapters' gradients accumulated.
Tensor output_backward(const Call& c, const KdaActs& a, const Tensor& dy, Tensor& dx) {
    const KdaDims& n = c.n;
    const KdaWeightViews& w = c.w;
    const int64_t n_tok = dy.dim(0);
    Tensor don = c.f32({n_tok, n.D});  // ∂L/∂on
    ops::linear_backward(c.ctx, dy, w.o_proj, don);
    lora_backward(c.ctx,
                  w.lora ? w.lora->o : nullptr,
                  w.lora_views.o,
                  c.batch(),
                  c.b.lora_rows,
                  a.on,
                  dy,
                  don);
    Tensor dgate = c.f32({n_tok, n.D});  // ∂L/∂(g_b g_a x), before σ
    Tensor dO = c.f32({n_tok, n.D});
    ops::kda_gated_norm_backward(c.ctx,
                                 a.o,
                                 a.nrm,
                                 a.gate,
                                 w.o_norm,
                                 static_cast<float>(c.cfg.rms_norm_eps),
                                 don,
                                 dO,
                                 dgate);
    Tensor dlow = c.f32({n_tok, n.K});
    ops::linear_backward(c.ctx, dgate, w.g_b_proj, dlow);
    ops::linear_backward(c.ctx, dlow, w.g_a_proj, dx, 1.0f);
    return dO;
}

// From the scan's dq (or dk, dv) [n_tok, D] back to dx: l2 (when `l2`, with q's `scale`), SiLU,
// the time-reversed conv per sequence, the projection and its adapters.
void qkv_backward(const Call& c,
                  const Tensor& x,
                  const Tensor& cv,  // [n_tok, D] the conv output
                  bool l2,
                  float scale,
                  const Tensor& conv,  // [D, 1, W]
                  const Tensor& proj,  // [D, d]
                  LoraSlot* slot,
                  const LoraSlotView& factors,
                  Tensor& grad,  // [n_tok, D] in: ∂L/∂(scan input); overwritten
                  Tensor& dx) {
    ops::kda_silu_l2_backward(c.ctx, cv, c.n.K, l2, scale, grad);  // ∂L/∂c
    Tensor du = c.f32(grad.shape);
    ops::causal_conv_backward(c.ctx, c.table, grad, conv, du);
    ops::linear_backward(c.ctx, du, proj, dx, 1.0f);
    lora_backward(c.ctx, slot, factors, c.batch(), c.b.lora_rows, x, du, dx);
}

}  // namespace

void kda_backward(const backend::Ctx& ctx,
                  const ModelConfig& cfg,
                  const KdaWeightViews& w,
                  const Tensor& x,
                  const KdaBatchViews& b,
                  const Tensor& dy,
                  Tensor& dx,
                  int chunk) {
    const KdaDims n(cfg);
    const int64_t n_tok = x.numel() / n.d;
    HYMOE_CHECK(b.batch != nullptr, "kda_backward: no batch");
    const SeqBatch& batch = *b.batch;
    HYMOE_CHECK(x.shape == (Shape{n_tok, n.d}) && dy.shape == x.shape && dx.shape == x.shape &&
                    batch.n_tok() == n_tok &&
                    (b.table.offsets == nullptr || b.table.n_tok == n_tok) && chunk > 0,
                "kda_backward: x ",
                shape_string(x.shape),
                " dy ",
                shape_string(dy.shape),
                " dx ",
                shape_string(dx.shape),
                ", ",
                batch.n_tok(),
                " tokens, chunk ",
                chunk);
    for (int64_t p0 : batch.pos0)
        HYMOE_CHECK(p0 == 0, "kda_backward: sequences must start fresh (pos0 ", p0, ")");

    Scratch scratch(ctx);
    const Call c{ctx,
                 scratch,
                 cfg,
                 w,
                 b,
                 b.table.offsets != nullptr ? b.table : batch_table(ctx, scratch, batch),
                 n,
                 chunk};
    const KdaActs a = recompute_forward(c, x);
    ops::upload(ctx, Buffer(DType::f32, dx.shape).view(), dx);  // dx = 0
    const Tensor dO = output_backward(c, a, dy, dx);

    Tensor dq = c.f32({n_tok, n.D}), dk = c.f32({n_tok, n.D}), dv = c.f32({n_tok, n.D});
    Tensor dg = c.f32({n_tok, n.D}), dbeta = c.f32({n_tok, n.H});
    const int64_t HKV = n.H * n.K * n.K;
    for (int64_t s = 0; s < batch.n_seq(); ++s) {
        const int64_t r = batch.offsets[s];
        const KdaScanGrads d{dO.ptr<float>() + r * n.D,
                             dq.ptr<float>() + r * n.D,
                             dk.ptr<float>() + r * n.D,
                             dv.ptr<float>() + r * n.D,
                             dg.ptr<float>() + r * n.D,
                             dbeta.ptr<float>() + r * n.H};
        ops::kda_scan_backward(ctx,
                               sequence_scan(a, n, batch, s),
                               a.ckpt.ptr<float>() + a.ckpt_first[static_cast<size_t>(s)] * HKV,
                               d,
                               chunk);
    }

    // β = σ(b_proj x): dlogit = dβ β(1 − β)
    ops::sigmoid_backward(ctx, a.beta, dbeta);
    ops::linear_backward(ctx, dbeta, w.b_proj, dx, 1.0f);
    // g = gate(f_b f_a x + dt_bias)
    ops::mul_inplace(ctx, dg, a.dg_dz);
    Tensor dlow = c.f32({n_tok, n.K});
    ops::linear_backward(ctx, dg, w.f_b_proj, dlow);
    ops::linear_backward(ctx, dlow, w.f_a_proj, dx, 1.0f);

    const LoraSlots none;
    const LoraSlots& host = w.lora ? *w.lora : none;
    const float scale = 1.0f / std::sqrt(static_cast<float>(n.K));
    qkv_backward(c, x, a.cq, true, scale, w.q_conv1d, w.q_proj, host.q, w.lora_views.q, dq, dx);
    qkv_backward(c, x, a.ck, true, 1.0f, w.k_conv1d, w.k_proj, host.k, w.lora_views.k, dk, dx);
    qkv_backward(c, x, a.cv, false, 1.0f, w.v_conv1d, w.v_proj, host.v, w.lora_views.v, dv, dx);
}

void kda_backward(const backend::Ctx& ctx,
                  const ModelConfig& cfg,
                  const KdaWeights& w,
                  const Tensor& x,
                  const SeqBatch& batch,
                  const Tensor& dy,
                  Tensor& dx,
                  int chunk) {
    kda_backward(ctx, cfg, kda_views(w), x, KdaBatchViews{&batch, {}, nullptr}, dy, dx, chunk);
}

}  // namespace hymoe::model
