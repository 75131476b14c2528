// The KDA block (spec/model-math.md §3): weights, per-sequence state, and the forward over a packed
// batch. Projections run over all tokens at once; the conv (with its tails) and the recurrence run
// per sequence, each continuing that sequence's KdaState. Every step is an op on the caller's Ctx
// (hymoe/backend/ops.h, ops_kda.h), so the forward on views (model/kda_views.h) runs on the CPU or,
// with device tensors, on a CUDA Ctx; only the LoRA adapters run on the host.
#include "hymoe/model/kda.h"

#include <cmath>
#include <optional>
#include <utility>

#include "hymoe/backend/ops.h"
#include "hymoe/backend/ops_kda.h"
#include "hymoe/core/error.h"
#include "hymoe/model/kda_views.h"
#include "hymoe/model/model.h"
#include "kda_dims.h"

namespace hymoe::model {

namespace {

// t's data as `shape` (as many elements), on t's device.
Tensor reshaped(const Tensor& t, Shape shape) {
    HYMOE_CHECK(t.numel() == shape_numel(shape),
                "kda_forward: a tensor of ",
                shape_string(t.shape),
                " used as ",
                shape_string(shape));
    return Tensor{t.data, t.dtype, t.device, std::move(shape)};
}

// out [n_tok, D] = SiLU(causal_conv(u)) per sequence, each conv continuing its tail [W−1, D].
void conv_silu(const backend::Ctx& ctx,
               const Tensor& u,  // [n_tok, D]
               const Tensor& w,  // [D, 1, W]
               const SeqBatch& batch,
               const std::vector<KdaStateViews>& states,
               Tensor KdaStateViews::*tail,  // the tail of q, k or v in each state
               const KdaDims& dims,
               Tensor& out) {  // [n_tok, D]
    const Tensor w2 = reshaped(w, {dims.D, dims.W});
    for (int64_t s = 0; s < batch.n_seq(); ++s) {
        if (batch.length(s) == 0)
            continue;
        Tensor us = u.rows(batch.offsets[s], batch.length(s));
        Tensor ys = out.rows(batch.offsets[s], batch.length(s));
        Tensor ts = states[s].*tail;
        ops::causal_conv(ctx, us, w2, ts, ys);
    }
    ops::silu_inplace(ctx, out);
}

// The recurrence of every sequence; o [n_tok, H, V].
void scan(const backend::Ctx& ctx,
          const KdaDims& dims,
          const SeqBatch& batch,
          const std::vector<KdaStateViews>& states,
          const float* q,     // [n_tok, H, K]
          const float* k,     // [n_tok, H, K]
          const float* v,     // [n_tok, H, V]
          const float* g,     // [n_tok, H, K]
          const float* beta,  // [n_tok, H]
          float* o,           // [n_tok, H, V]
          KdaMode mode) {
    for (int64_t s = 0; s < batch.n_seq(); ++s) {
        const int64_t r = batch.offsets[s];
        KdaScanParams p;
        p.n_tok = batch.length(s);
        p.n_head = static_cast<int>(dims.H);
        p.d_k = static_cast<int>(dims.K);
        p.d_v = static_cast<int>(dims.K);
        p.q = q + r * dims.D;
        p.k = k + r * dims.D;
        p.v = v + r * dims.D;
        p.g = g + r * dims.D;
        p.beta = beta + r * dims.H;
        p.S = states[s].S.ptr<float>();
        p.o = o + r * dims.D;
        const bool chunked =
            mode == KdaMode::chunked || (mode == KdaMode::automatic && p.n_tok > 1);
        static_assert(kPrefillAlign % 64 == 0, "model.h: kPrefillAlign, kda_chunked's chunk");
        if (chunked)
            ops::kda_chunked(ctx, p);
        else
            ops::kda_recurrent(ctx, p);
    }
}

}  // namespace

TensorList kda_tensors(const ModelConfig& cfg, KdaWeights* w) {
    const KdaDims n(cfg);  // H, D: this rank's heads under tp (model/shard.h)
    using W = KdaWeights;
    return in_block(WeightBlock::kda,
                    {
                        split(0, {"q_proj.weight", {n.D, n.d}, slot(w, &W::q_proj)}),
                        split(0, {"k_proj.weight", {n.D, n.d}, slot(w, &W::k_proj)}),
                        split(0, {"v_proj.weight", {n.D, n.d}, slot(w, &W::v_proj)}),
                        split(0, {"q_conv1d.weight", {n.D, 1, n.W}, slot(w, &W::q_conv1d)}),
                        split(0, {"k_conv1d.weight", {n.D, 1, n.W}, slot(w, &W::k_conv1d)}),
                        split(0, {"v_conv1d.weight", {n.D, 1, n.W}, slot(w, &W::v_conv1d)}),
                        {"f_a_proj.weight", {n.K, n.d}, slot(w, &W::f_a_proj)},
                        split(0, {"f_b_proj.weight", {n.D, n.K}, slot(w, &W::f_b_proj)}),
                        split(0, {"dt_bias", {n.D}, slot(w, &W::dt_bias), Init::kda_dt_bias}),
                        split(2, {"A_log", {1, 1, n.H, 1}, slot(w, &W::a_log), Init::kda_a_log}),
                        split(0, {"b_proj.weight", {n.H, n.d}, slot(w, &W::b_proj)}),
                        {"g_a_proj.weight", {n.K, n.d}, slot(w, &W::g_a_proj)},
                        split(0, {"g_b_proj.weight", {n.D, n.K}, slot(w, &W::g_b_proj)}),
                        {"o_norm.weight", {n.K}, slot(w, &W::o_norm), Init::ones},
                        split(1, {"o_proj.weight", {n.d, n.D}, slot(w, &W::o_proj)}),
                    });
}

KdaState make_kda_state(const ModelConfig& cfg) {
    const KdaDims n(cfg);
    KdaState st;
    st.S = Buffer(DType::f32, {n.H, n.K, n.K});
    st.q_tail = Buffer(DType::f32, {n.W - 1, n.D});
    st.k_tail = Buffer(DType::f32, {n.W - 1, n.D});
    st.v_tail = Buffer(DType::f32, {n.W - 1, n.D});
    return st;
}

KdaWeightViews kda_views(const KdaWeights& w) {
    return {w.q_proj.view(),
            w.k_proj.view(),
            w.v_proj.view(),
            w.q_conv1d.view(),
            w.k_conv1d.view(),
            w.v_conv1d.view(),
            w.f_a_proj.view(),
            w.f_b_proj.view(),
            w.dt_bias.view(),
            w.a_log.view(),
            w.b_proj.view(),
            w.g_a_proj.view(),
            w.g_b_proj.view(),
            w.o_norm.view(),
            w.o_proj.view(),
            &w.lora};
}

KdaStateViews kda_views(KdaState& st) {
    return {st.S.view(), st.q_tail.view(), st.k_tail.view(), st.v_tail.view()};
}

void kda_forward(const backend::Ctx& ctx,
                 const ModelConfig& cfg,
                 const KdaWeights& w,
                 const Tensor& x,
                 const SeqBatch& batch,
                 const std::vector<KdaState*>& states,
                 Tensor& y,
                 KdaMode mode) {
    std::vector<KdaStateViews> views;
    views.reserve(states.size());
    for (KdaState* st : states) {
        HYMOE_CHECK(st != nullptr,
                    "kda_forward: a state not made by make_kda_state for this config");
        views.push_back(kda_views(*st));
    }
    kda_forward(ctx, cfg, kda_views(w), x, batch, views, y, mode);
}

void kda_forward(const backend::Ctx& ctx,
                 const ModelConfig& cfg,
                 const KdaWeightViews& w,
                 const Tensor& x,
                 const SeqBatch& batch,
                 const std::vector<KdaStateViews>& states,
                 Tensor& y,
                 KdaMode mode) {
    const KdaDims n(cfg);
    const int64_t n_tok = x.numel() / n.d;
    HYMOE_CHECK(x.shape == (Shape{n_tok, n.d}) && y.shape == x.shape && batch.n_tok() == n_tok &&
                    static_cast<int64_t>(states.size()) == batch.n_seq(),
                "kda_forward: x ",
                shape_string(x.shape),
                " y ",
                shape_string(y.shape),
                ", ",
                batch.n_tok(),
                " tokens in ",
                batch.n_seq(),
                " sequences, ",
                states.size(),
                " states");
    const LoraSlots none;
    const LoraSlots& lora = w.lora ? *w.lora : none;
    HYMOE_CHECK(ctx.device == Device::cpu || !(lora.q || lora.k || lora.v || lora.o),
                "kda_forward: LoRA adapters run on the host so far: a ",
                to_string(ctx.device),
                " context");
    for (const KdaStateViews& st : states)
        HYMOE_CHECK(st.S.shape == (Shape{n.H, n.K, n.K}) && st.S.dtype == DType::f32,
                    "kda_forward: a state not made by make_kda_state for this config");
    backend::Scratch scratch(ctx);

    // q, k, v: projection → conv → SiLU → l2 per head (q also × K^{-1/2})
    Tensor proj = scratch(DType::f32, {n_tok, n.D});  // [n_tok, D] pre-conv, reused for q, k, v
    Tensor q = scratch(DType::f32, {n_tok, n.D});
    Tensor k = scratch(DType::f32, {n_tok, n.D});
    Tensor v = scratch(DType::f32, {n_tok, n.D});
    ops::linear(ctx, x, w.q_proj, proj);
    lora_forward(lora.q, batch, x, proj);
    conv_silu(ctx, proj, w.q_conv1d, batch, states, &KdaStateViews::q_tail, n, q);
    ops::linear(ctx, x, w.k_proj, proj);
    lora_forward(lora.k, batch, x, proj);
    conv_silu(ctx, proj, w.k_conv1d, batch, states, &KdaStateViews::k_tail, n, k);
    ops::linear(ctx, x, w.v_proj, proj);
    lora_forward(lora.v, batch, x, proj);
    conv_silu(ctx, proj, w.v_conv1d, batch, states, &KdaStateViews::v_tail, n, v);
    Tensor q_heads = reshaped(q, {n_tok * n.H, n.K}), k_heads = reshaped(k, {n_tok * n.H, n.K});
    ops::l2_norm_rows(ctx, q_heads);
    ops::l2_norm_rows(ctx, k_heads);
    ops::scale_inplace(ctx, q, 1.0f / std::sqrt(static_cast<float>(n.K)));

    // g = decay(f_b f_a x), β = σ(b_proj x)
    Tensor low = scratch(DType::f32, {n_tok, n.K});  // [n_tok, K] low-rank (decay, then gate)
    Tensor g = scratch(DType::f32, {n_tok, n.D});
    ops::linear(ctx, x, w.f_a_proj, low);
    ops::linear(ctx, low, w.f_b_proj, g);
    const auto& lb = cfg.kda.gate_lower_bound;
    ops::kda_decay_gate(ctx,
                        g,
                        reshaped(w.a_log, {n.H}),
                        w.dt_bias,
                        lb ? std::optional<float>(static_cast<float>(*lb)) : std::nullopt);
    Tensor beta = scratch(DType::f32, {n_tok, n.H});
    ops::linear(ctx, x, w.b_proj, beta);
    ops::sigmoid_inplace(ctx, beta);

    Tensor o = scratch(DType::f32, {n_tok, n.D});  // [n_tok, H, V]
    scan(ctx,
         n,
         batch,
         states,
         q.ptr<float>(),
         k.ptr<float>(),
         v.ptr<float>(),
         g.ptr<float>(),
         beta.ptr<float>(),
         o.ptr<float>(),
         mode);

    // y = o_proj(RMSNorm(o_h; o_norm) ⊙ σ(g_b g_a x))
    Tensor gate = scratch(DType::f32, {n_tok, n.D});
    ops::linear(ctx, x, w.g_a_proj, low);
    ops::linear(ctx, low, w.g_b_proj, gate);
    ops::sigmoid_inplace(ctx, gate);
    Tensor heads = reshaped(o, {n_tok * n.H, n.K});
    ops::rms_norm(ctx, heads, w.o_norm, static_cast<float>(cfg.rms_norm_eps), heads);
    ops::mul_inplace(ctx, o, gate);
    ops::linear(ctx, o, w.o_proj, y);
    lora_forward(lora.o, batch, o, y);
}

}  // namespace hymoe::model
