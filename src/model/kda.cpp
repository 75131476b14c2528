// The KDA block (spec/model-math.md §3): weights, per-sequence state, and the forward over a packed
// batch. Projections run over all tokens at once; the conv (with its tails) and the recurrence run
// per sequence, each continuing that sequence's KdaState. The scans are backend ops
// (hymoe/backend/ops.h) on the caller's Ctx; so far the block's own loops (decay gate, l2 norms,
// output gate) and the adapters run on the host, so the Ctx is the CPU's.
#include "hymoe/model/kda.h"

#include <cmath>

#include "hymoe/backend/ops.h"
#include "hymoe/core/error.h"
#include "hymoe/model/model.h"
#include "kda_dims.h"

namespace hymoe::model {

namespace {

// An fp32 host view of `p` with `shape` (a reshape of an existing buffer, or a row range of one).
Tensor view(float* p, Shape shape) {
    return Tensor{p, DType::f32, Device::cpu, std::move(shape)};
}

// out [n_tok, D] = SiLU(causal_conv(u)) per sequence, each conv continuing its tail [W−1, D].
void conv_silu(const backend::Ctx& ctx,
               const Tensor& u,  // [n_tok, D]
               const Buffer& w,  // [D, 1, W]
               const SeqBatch& batch,
               const std::vector<KdaState*>& states,
               Buffer KdaState::*tail,  // the tail of q, k or v in each state
               const KdaDims& dims,
               Tensor& out) {  // [n_tok, D]
    const Tensor w2 = view(w.ptr<float>(), {dims.D, dims.W});
    for (int64_t s = 0; s < batch.n_seq(); ++s) {
        if (batch.length(s) == 0)
            continue;
        Tensor us = u.rows(batch.offsets[s], batch.length(s));
        Tensor ys = out.rows(batch.offsets[s], batch.length(s));
        Tensor ts = (states[s]->*tail).view();
        ops::causal_conv(ctx, us, w2, ts, ys);
    }
    ops::silu_inplace(ctx, out);
}

// g [n_tok, H, K] ← log-decay from the decay logits f [n_tok, H, K] (in place), fp32:
// −e^{A_log_h}·softplus(f + dt_bias), or lb·σ(e^{A_log_h}(f + dt_bias)) with a lower bound lb.
void decay_gate(const KdaConfig& kc, const KdaWeights& w, const KdaDims& dims, Tensor& g) {
    const float* a_log = w.a_log.ptr<float>();  // [H]
    const float* dt_bias = w.dt_bias.ptr<float>();
    float* gp = g.ptr<float>();
    const int64_t n_tok = g.dim(0);
    for (int64_t t = 0; t < n_tok; ++t) {
        for (int64_t h = 0; h < dims.H; ++h) {
            const float a = std::exp(a_log[h]);
            for (int64_t i = h * dims.K; i < (h + 1) * dims.K; ++i) {
                float& x = gp[t * dims.D + i];
                const float z = x + dt_bias[i];
                x = kc.gate_lower_bound
                        ? static_cast<float>(*kc.gate_lower_bound) * ops::sigmoid(a * z)
                        : -a * ops::softplus(z);
            }
        }
    }
}

// The recurrence of every sequence; o [n_tok, H, V].
void scan(const backend::Ctx& ctx,
          const KdaDims& dims,
          const SeqBatch& batch,
          const std::vector<KdaState*>& states,
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
        p.S = states[s]->S.ptr<float>();
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

void kda_forward(const backend::Ctx& ctx,
                 const ModelConfig& cfg,
                 const KdaWeights& w,
                 const Tensor& x,
                 const SeqBatch& batch,
                 const std::vector<KdaState*>& states,
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
    HYMOE_CHECK(
        ctx.device == Device::cpu,
        "kda_forward: the block's decay gate, norms and adapters run on the host so far: a ",
        to_string(ctx.device),
        " context");
    for (const KdaState* st : states)
        HYMOE_CHECK(st && st->S.view().shape == (Shape{n.H, n.K, n.K}),
                    "kda_forward: a state not made by make_kda_state for this config");

    // q, k, v: projection → conv → SiLU → l2 per head (q also × K^{-1/2})
    Buffer proj(DType::f32, {n_tok, n.D});  // [n_tok, D] pre-conv, reused for q, k, v
    Buffer q(DType::f32, {n_tok, n.D}), k(DType::f32, {n_tok, n.D}), v(DType::f32, {n_tok, n.D});
    ops::linear(ctx, x, w.q_proj.view(), proj.view());
    lora_forward(w.lora.q, batch, x, proj.view());
    conv_silu(ctx, proj.view(), w.q_conv1d, batch, states, &KdaState::q_tail, n, q.view());
    ops::linear(ctx, x, w.k_proj.view(), proj.view());
    lora_forward(w.lora.k, batch, x, proj.view());
    conv_silu(ctx, proj.view(), w.k_conv1d, batch, states, &KdaState::k_tail, n, k.view());
    ops::linear(ctx, x, w.v_proj.view(), proj.view());
    lora_forward(w.lora.v, batch, x, proj.view());
    conv_silu(ctx, proj.view(), w.v_conv1d, batch, states, &KdaState::v_tail, n, v.view());
    ops::l2_norm_rows(q.ptr<float>(), n_tok * n.H, n.K);
    ops::l2_norm_rows(k.ptr<float>(), n_tok * n.H, n.K);
    const float scale = 1.0f / std::sqrt(static_cast<float>(n.K));
    for (int64_t i = 0; i < n_tok * n.D; ++i)
        q.ptr<float>()[i] *= scale;

    // g = decay(f_b f_a x), β = σ(b_proj x)
    Buffer low(DType::f32, {n_tok, n.K});  // [n_tok, K] low-rank activations (decay, then gate)
    Buffer g(DType::f32, {n_tok, n.D});
    ops::linear(ctx, x, w.f_a_proj.view(), low.view());
    ops::linear(ctx, low.view(), w.f_b_proj.view(), g.view());
    decay_gate(cfg.kda, w, n, g.view());
    Buffer beta(DType::f32, {n_tok, n.H});
    ops::linear(ctx, x, w.b_proj.view(), beta.view());
    ops::sigmoid_inplace(ctx, beta.view());

    Buffer o(DType::f32, {n_tok, n.D});  // [n_tok, H, V]
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
    Buffer gate(DType::f32, {n_tok, n.D});
    ops::linear(ctx, x, w.g_a_proj.view(), low.view());
    ops::linear(ctx, low.view(), w.g_b_proj.view(), gate.view());
    ops::sigmoid_inplace(ctx, gate.view());
    Tensor heads = view(o.ptr<float>(), {n_tok * n.H, n.K});
    ops::rms_norm(ctx, heads, w.o_norm.view(), static_cast<float>(cfg.rms_norm_eps), heads);
    for (int64_t i = 0; i < n_tok * n.D; ++i)
        o.ptr<float>()[i] *= gate.ptr<float>()[i];
    ops::linear(ctx, o.view(), w.o_proj.view(), y);
    lora_forward(w.lora.o, batch, o.view(), y);
}

}  // namespace hymoe::model
