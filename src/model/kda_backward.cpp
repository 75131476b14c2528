// The KDA block's backward (spec/model-math.md §3, §9) over a packed batch of fresh sequences:
// recompute the forward from x keeping what the backward reads (KdaActs), then walk back
//   y = o_proj(on) (+ LoRA o),  on = RMSNorm(o_h; o_norm) ⊙ σ(g_b g_a x),  o = scan(q, k, v, g, β),
//   q = l2(SiLU(conv(q_proj x (+ LoRA q))))·K^{-1/2},  k likewise without the scale,
//   v = SiLU(conv(v_proj x (+ LoRA v))),  g = gate(f_b f_a x + dt_bias),  β = σ(b_proj x),
// summing every path into dx: the q, k, v projections, the decay path (f_a, f_b), β (b_proj) and
// the output gate (g_a, g_b). The scan and its backward are backend ops (hymoe/backend/ops.h) on
// the caller's Ctx (the CPU's so far), and so are the activations' recompute and backward, the
// gates' and the conv's backward (backend/ops_kda_backward.h). Each sequence's conv starts from a
// zero tail and its
// recurrence from a zero state (nothing crosses sequences). Only the adapters learn: lora_backward
// accumulates (+=) their dA, dB; dx is overwritten.
#include <algorithm>
#include <cmath>

#include "hymoe/backend/ops.h"
#include "hymoe/backend/ops_attention.h"
#include "hymoe/backend/ops_kda.h"
#include "hymoe/backend/ops_kda_backward.h"
#include "hymoe/core/error.h"
#include "hymoe/model/kda.h"
#include "kda_dims.h"

namespace hymoe::model {

namespace {

// What the backward reads from the forward, recomputed from x.
struct KdaActs {
    Buffer cq, ck, cv;         // [n_tok, D] conv outputs, before SiLU
    Buffer q, k, v;            // [n_tok, D] scan inputs ([n_tok, H, K]; q, k l2-normalised)
    Buffer g;                  // [n_tok, D] log-decay
    Buffer dg_dz;              // [n_tok, D] ∂g/∂(f + dt_bias)
    Buffer beta;               // [n_tok, H]
    Buffer o;                  // [n_tok, D] scan output
    Buffer nrm;                // [n_tok, D] RMSNorm(o_h; o_norm)
    Buffer gate;               // [n_tok, D] σ(g_b g_a x)
    Buffer on;                 // [n_tok, D] nrm ⊙ gate: o_proj's input
    std::vector<Buffer> ckpt;  // [n_seq] states before each chunk [⌈T_s/C⌉, H, K, V]
};

// dst [m, n] (+)= a [m, k] · w [k, n], row-major, contiguous; w a weight at its storage dtype.
void matmul(
    int64_t m, int64_t n, int64_t k, const float* a, const Buffer& w, float* dst, float beta) {
    ops::gemm_w(false, m, n, k, 1.0f, a, k, ops::weight_ref(w.view()), n, beta, dst, n);
}

// c [n_tok, D] = conv(x Wᵀ (+ LoRA)) per sequence from a zero tail, before SiLU.
void project_conv(const Tensor& x,
                  const Buffer& proj,  // [D, d]
                  const LoraSlot* slot,
                  const Buffer& conv,  // [D, 1, W]
                  const SeqBatch& batch,
                  const KdaDims& n,
                  Buffer& c) {
    const int64_t n_tok = x.dim(0);
    Buffer u(DType::f32, {n_tok, n.D});
    ops::linear(x, proj.view(), u.view());
    lora_forward(slot, batch, x, u.view());
    c = Buffer(DType::f32, {n_tok, n.D});
    const Tensor w2{conv.ptr<float>(), DType::f32, Device::cpu, {n.D, n.W}};
    for (int64_t s = 0; s < batch.n_seq(); ++s) {
        if (batch.length(s) == 0)
            continue;
        Buffer tail(DType::f32, {n.W - 1, n.D});  // zeros: a fresh sequence
        Tensor us = u.view().rows(batch.offsets[s], batch.length(s));
        Tensor cs = c.view().rows(batch.offsets[s], batch.length(s));
        Tensor tv = tail.view();
        ops::causal_conv(us, w2, tv, cs);
    }
}

// out = SiLU(c), then l2-normalised per head and scaled when `l2`.
void silu_l2(
    const backend::Ctx& ctx, const Buffer& c, bool l2, float scale, const KdaDims& n, Buffer& out) {
    out = Buffer(DType::f32, {c.view().dim(0), n.D});
    ops::kda_silu_l2(ctx, c.view(), n.K, l2, scale, out.view());
}

// g and ∂g/∂z from the decay logits z = f_b f_a x + dt_bias (ops::kda_decay_gate_grad).
void decay_gate(const backend::Ctx& ctx,
                const KdaConfig& kc,
                const KdaWeights& w,
                const Tensor& x,
                const KdaDims& n,
                KdaActs& a) {
    const int64_t n_tok = x.dim(0);
    Buffer low(DType::f32, {n_tok, n.K});
    a.g = Buffer(DType::f32, {n_tok, n.D});
    a.dg_dz = Buffer(DType::f32, {n_tok, n.D});
    ops::linear(x, w.f_a_proj.view(), low.view());
    ops::linear(low.view(), w.f_b_proj.view(), a.g.view());
    const auto& lb = kc.gate_lower_bound;
    ops::kda_decay_gate_grad(ctx,
                             a.g.view(),
                             w.a_log.view(),
                             w.dt_bias.view(),
                             lb ? std::optional<float>(static_cast<float>(*lb)) : std::nullopt,
                             a.dg_dz.view());
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
void scan_forward(
    const backend::Ctx& ctx, const KdaDims& n, const SeqBatch& batch, int chunk, KdaActs& a) {
    a.o = Buffer(DType::f32, {a.q.view().dim(0), n.D});
    a.ckpt.clear();
    for (int64_t s = 0; s < batch.n_seq(); ++s) {
        const int64_t T = batch.length(s);
        Buffer S(DType::f32, {n.H, n.K, n.K});  // zeros: a fresh sequence
        a.ckpt.emplace_back(DType::f32,
                            Shape{std::max<int64_t>(1, (T + chunk - 1) / chunk), n.H, n.K, n.K});
        KdaScanParams p = sequence_scan(a, n, batch, s);
        p.S = S.ptr<float>();
        p.o = a.o.ptr<float>() + batch.offsets[s] * n.D;
        ops::kda_chunked_checkpoints(ctx, p, a.ckpt.back().ptr<float>(), chunk);
    }
}

// The forward of kda_forward for fresh sequences, keeping the activations.
KdaActs recompute_forward(const backend::Ctx& ctx,
                          const ModelConfig& cfg,
                          const KdaWeights& w,
                          const Tensor& x,
                          const SeqBatch& batch,
                          int chunk) {
    const KdaDims n(cfg);
    const int64_t n_tok = x.dim(0);
    KdaActs a;
    const float scale = 1.0f / std::sqrt(static_cast<float>(n.K));
    project_conv(x, w.q_proj, w.lora.q, w.q_conv1d, batch, n, a.cq);
    project_conv(x, w.k_proj, w.lora.k, w.k_conv1d, batch, n, a.ck);
    project_conv(x, w.v_proj, w.lora.v, w.v_conv1d, batch, n, a.cv);
    silu_l2(ctx, a.cq, true, scale, n, a.q);
    silu_l2(ctx, a.ck, true, 1.0f, n, a.k);
    silu_l2(ctx, a.cv, false, 1.0f, n, a.v);
    decay_gate(ctx, cfg.kda, w, x, n, a);
    a.beta = Buffer(DType::f32, {n_tok, n.H});
    ops::linear(x, w.b_proj.view(), a.beta.view());
    ops::sigmoid_inplace(a.beta.view());
    scan_forward(ctx, n, batch, chunk, a);

    Buffer low(DType::f32, {n_tok, n.K});
    a.gate = Buffer(DType::f32, {n_tok, n.D});
    ops::linear(x, w.g_a_proj.view(), low.view());
    ops::linear(low.view(), w.g_b_proj.view(), a.gate.view());
    ops::sigmoid_inplace(a.gate.view());
    a.nrm = Buffer(DType::f32, {n_tok, n.D});
    Tensor heads{a.o.ptr<float>(), DType::f32, Device::cpu, {n_tok * n.H, n.K}};
    Tensor nrm_heads{a.nrm.ptr<float>(), DType::f32, Device::cpu, {n_tok * n.H, n.K}};
    ops::rms_norm(heads, w.o_norm.view(), static_cast<float>(cfg.rms_norm_eps), nrm_heads);
    a.on = Buffer(DType::f32, {n_tok, n.D});
    ops::copy_cols(ctx, a.nrm.view(), 0, a.on.view());
    ops::mul_inplace(ctx, a.on.view(), a.gate.view());
    return a;
}

// From dy [n_tok, d] back to dO [n_tok, D], the scan output's gradient; the output gate's path
// (g_a, g_b) is added to dx, the o adapter's gradients accumulated.
void output_backward(const backend::Ctx& ctx,
                     const ModelConfig& cfg,
                     const KdaWeights& w,
                     const SeqBatch& batch,
                     const KdaActs& a,
                     const Tensor& dy,
                     Buffer& dO,
                     Tensor& dx) {
    const KdaDims n(cfg);
    const int64_t n_tok = dy.dim(0);
    Buffer don(DType::f32, {n_tok, n.D});  // ∂L/∂on
    matmul(n_tok, n.D, n.d, dy.ptr<float>(), w.o_proj, don.ptr<float>(), 0.0f);
    Tensor don_t = don.view();
    lora_backward(w.lora.o, batch, a.on.view(), dy, don_t);

    Buffer dgate(DType::f32, {n_tok, n.D});  // ∂L/∂(g_b g_a x), before σ
    dO = Buffer(DType::f32, {n_tok, n.D});
    ops::kda_gated_norm_backward(ctx,
                                 a.o.view(),
                                 a.nrm.view(),
                                 a.gate.view(),
                                 w.o_norm.view(),
                                 static_cast<float>(cfg.rms_norm_eps),
                                 don.view(),
                                 dO.view(),
                                 dgate.view());
    Buffer dlow(DType::f32, {n_tok, n.K});
    matmul(n_tok, n.K, n.D, dgate.ptr<float>(), w.g_b_proj, dlow.ptr<float>(), 0.0f);
    matmul(n_tok, n.d, n.K, dlow.ptr<float>(), w.g_a_proj, dx.ptr<float>(), 1.0f);
}

// From the scan's dq (or dk, dv) [n_tok, D] back to dx: l2 (when `l2`, with q's `scale`), SiLU,
// the time-reversed conv per sequence, the projection and its adapter.
void qkv_backward(const backend::Ctx& ctx,
                  const Tensor& x,
                  const SeqBatch& batch,
                  const Buffer& c,  // [n_tok, D] the conv output
                  bool l2,
                  float scale,
                  const Buffer& conv,  // [D, 1, W]
                  const Buffer& proj,  // [D, d]
                  LoraSlot* slot,
                  const KdaDims& n,
                  Buffer& grad,  // [n_tok, D] in: ∂L/∂(scan input); overwritten
                  Tensor& dx) {
    const int64_t n_tok = x.dim(0);
    ops::kda_silu_l2_backward(ctx, c.view(), n.K, l2, scale, grad.view());  // ∂L/∂c
    ops::KdaSeqTable t;  // each sequence's rows, for the conv's time-reversed backward
    t.n_tok = n_tok;
    t.n_seq = batch.n_seq();
    t.offsets = batch.offsets.data();
    Buffer du(DType::f32, {n_tok, n.D});
    ops::causal_conv_backward(ctx, t, grad.view(), conv.view(), du.view());
    matmul(n_tok, n.d, n.D, du.ptr<float>(), proj, dx.ptr<float>(), 1.0f);
    lora_backward(slot, batch, x, du.view(), dx);
}

}  // namespace

void kda_backward(const backend::Ctx& ctx,
                  const ModelConfig& cfg,
                  const KdaWeights& w,
                  const Tensor& x,
                  const SeqBatch& batch,
                  const Tensor& dy,
                  Tensor& dx,
                  int chunk) {
    const KdaDims n(cfg);
    const int64_t n_tok = x.numel() / n.d;
    HYMOE_CHECK(x.shape == (Shape{n_tok, n.d}) && dy.shape == x.shape && dx.shape == x.shape &&
                    batch.n_tok() == n_tok && chunk > 0,
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
    HYMOE_CHECK(ctx.device == Device::cpu,
                "kda_backward: the block's own loops and adapters run on the host so far: a ",
                to_string(ctx.device),
                " context");
    for (int64_t p0 : batch.pos0)
        HYMOE_CHECK(p0 == 0, "kda_backward: sequences must start fresh (pos0 ", p0, ")");

    const KdaActs a = recompute_forward(ctx, cfg, w, x, batch, chunk);
    std::fill(dx.ptr<float>(), dx.ptr<float>() + n_tok * n.d, 0.0f);
    Buffer dO;
    output_backward(ctx, cfg, w, batch, a, dy, dO, dx);

    Buffer dq(DType::f32, {n_tok, n.D}), dk(DType::f32, {n_tok, n.D}), dv(DType::f32, {n_tok, n.D});
    Buffer dg(DType::f32, {n_tok, n.D}), dbeta(DType::f32, {n_tok, n.H});
    for (int64_t s = 0; s < batch.n_seq(); ++s) {
        const int64_t r = batch.offsets[s];
        const KdaScanGrads d{dO.ptr<float>() + r * n.D,
                             dq.ptr<float>() + r * n.D,
                             dk.ptr<float>() + r * n.D,
                             dv.ptr<float>() + r * n.D,
                             dg.ptr<float>() + r * n.D,
                             dbeta.ptr<float>() + r * n.H};
        ops::kda_scan_backward(
            ctx, sequence_scan(a, n, batch, s), a.ckpt[s].ptr<float>(), d, chunk);
    }

    // β = σ(b_proj x): dlogit = dβ β(1 − β)
    ops::sigmoid_backward(ctx, a.beta.view(), dbeta.view());
    matmul(n_tok, n.d, n.H, dbeta.ptr<float>(), w.b_proj, dx.ptr<float>(), 1.0f);
    // g = gate(f_b f_a x + dt_bias)
    ops::mul_inplace(ctx, dg.view(), a.dg_dz.view());
    Buffer dlow(DType::f32, {n_tok, n.K});
    matmul(n_tok, n.K, n.D, dg.ptr<float>(), w.f_b_proj, dlow.ptr<float>(), 0.0f);
    matmul(n_tok, n.d, n.K, dlow.ptr<float>(), w.f_a_proj, dx.ptr<float>(), 1.0f);

    const float scale = 1.0f / std::sqrt(static_cast<float>(n.K));
    qkv_backward(ctx, x, batch, a.cq, true, scale, w.q_conv1d, w.q_proj, w.lora.q, n, dq, dx);
    qkv_backward(ctx, x, batch, a.ck, true, 1.0f, w.k_conv1d, w.k_proj, w.lora.k, n, dk, dx);
    qkv_backward(ctx, x, batch, a.cv, false, 1.0f, w.v_conv1d, w.v_proj, w.lora.v, n, dv, dx);
}

}  // namespace hymoe::model
