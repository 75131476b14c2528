// Backward of the MLA / DSA / gated attention layer (spec/model-math.md §4, §5, §9) in the expanded
// (MHA) form, for sequences that start fresh (pos0 = 0, no cache: the training case), and the
// training forward of the same block (model/attention_backward_views.h). The forward is recomputed
// from x (attention_sweep.h: mla_project, the indexer's top-k mask, the sweep, the gate), then,
// with u = o ⊙ σ(z), z = W_g x (u = o ungated):
//   y = W_o u (+ o's adapter):   du = dy W_o (+ adapter)
//   gate:                        do = du ⊙ σ(z), dz = du ⊙ o ⊙ σ(z)(1 − σ(z)), dx += dz W_g
//   the sweep (attention_sweep.h) from do: dq, d[k_n | v] per head, dk_r = Σ_h dK_h[:, d_n:]
//   [k_n | v]_h = (W_kvb c_kv)_h, c_kv = RMSNorm(a_kv), q_r and k_r rotated (RoPE backward),
//   dx += d[a_kv | k_r] W_kva (+ kv's adapter) + the query path (W_qb, q_a_layernorm, W_qa, or
//   W_q without a latent, + q's adapter).
// The indexer's mask is recomputed and held constant: the indexer gets no gradient (its input is
// detached by design). Rule (llm.c): dx is overwritten, adapter gradients accumulate. Every step
// is an op on the caller's Ctx; the host entries (model/attention.h, attention_views.h) wrap it.
#include <utility>

#include "attention_sweep.h"
#include "hymoe/backend/ops.h"
#include "hymoe/backend/ops_attention.h"
#include "hymoe/backend/ops_backward.h"
#include "hymoe/backend/ops_kda.h"
#include "hymoe/backend/ops_rows.h"
#include "hymoe/backend/ops_strided.h"
#include "hymoe/model/attention.h"
#include "hymoe/model/attention_backward_views.h"
#include "hymoe/model/lora.h"

namespace hymoe::model {

using backend::Scratch;
using detail::mla_dims;
using detail::MlaDims;

void attention_backward(const backend::Ctx& ctx,
                        const ModelConfig& cfg,
                        const LayerSpec& spec,
                        const MlaWeightViews& w,
                        const Tensor& x,
                        const AttnBatchViews& b,
                        const Tensor& dy,
                        Tensor& dx,
                        const comm::Comm* tp) {
    detail::check_fresh("attention_backward", cfg, spec, w, x, b, &dy, &dx);
    const SeqBatch& batch = *b.batch;
    const MlaDims m = mla_dims(cfg);
    const int64_t n_tok = x.dim(0), ld_o = m.n_head * m.d_v;
    const float eps = static_cast<float>(cfg.mla.norm_eps);
    const LoraSlots none;
    const LoraSlots& host = w.lora ? *w.lora : none;
    Scratch scratch(ctx);
    auto f32 = [&](Shape shape) { return scratch(DType::f32, std::move(shape)); };
    const detail::FreshCall c{ctx, cfg, spec, batch, detail::fresh_positions(ctx, scratch, b), tp};
    const detail::FreshActs a = detail::fresh_forward(c, scratch, w, x);
    ops::fill_zero(ctx, dx);

    // y = W_o u: du [n_tok, H·d_v] = dy W_o (+ o's adapter, whose input is u = o ⊙ σ(z) or o)
    Tensor u = f32({n_tok, ld_o});
    ops::copy_cols(ctx, a.o, 0, u);
    if (spec.gated)
        ops::mul_inplace(ctx, u, a.g);
    Tensor du = f32({n_tok, ld_o});
    ops::linear_backward(ctx, dy, w.o_proj, du);
    lora_backward(ctx, host.o, w.lora_views.o, batch, w.lora_rows, u, dy, du);
    if (spec.gated) {  // do = du ⊙ σ(z) (in du); dz = du ⊙ o ⊙ σ(z)(1 − σ(z)) (in u)
        ops::sigmoid_gate_backward(ctx, du, a.o, a.g, u);
        ops::linear_backward(ctx, u, w.g_proj, dx, 1.0f);
    }

    Tensor dq = f32({n_tok, m.n_head * m.d_qk()});
    Tensor dkvb = f32({n_tok, m.n_head * m.d_kvb()});
    Tensor dk_r = f32({n_tok, m.d_r});
    detail::attend_backward(c, a, du, dq, dkvb, dk_r);
    if (!cfg.mla.nope) {
        const ops::RopeFreqs freqs = mla_rope_freqs(cfg.mla);
        ops::rope_backward(ctx, dq, m.d_n, m.n_head, m.d_qk(), c.pos, freqs, true);
        ops::rope_backward(ctx, dk_r, 0, 1, m.d_r, c.pos, freqs, true);
    }

    // latent path: d[a_kv | k_r] [n_tok, r_kv + d_r] → dx through W_kva and kv's adapter
    Tensor dc_kv = f32({n_tok, m.r_kv});
    ops::linear_backward(ctx, dkvb, w.kv_b_proj, dc_kv);
    ops::rms_norm_backward(ctx, a.p.a_kv, w.kv_a_layernorm, eps, dc_kv, dc_kv);
    Tensor dkv = f32({n_tok, m.d_lat()});
    ops::copy_block(ctx, n_tok, m.r_kv, {dc_kv, 0, m.r_kv}, {dkv, 0, m.d_lat()});
    ops::copy_block(ctx, n_tok, m.d_r, {dk_r, 0, m.d_r}, {dkv, m.r_kv, m.d_lat()});
    ops::linear_backward(ctx, dkv, w.kv_a_proj_with_mqa, dx, 1.0f);
    lora_backward(ctx, host.kv, w.lora_views.kv, batch, w.lora_rows, x, dkv, dx);

    // query path
    if (m.r_q > 0) {
        Tensor dc_q = f32({n_tok, m.r_q});
        ops::linear_backward(ctx, dq, w.q_b_proj, dc_q);
        lora_backward(ctx, host.q, w.lora_views.q, batch, w.lora_rows, a.p.c_q, dq, dc_q);
        ops::rms_norm_backward(ctx, a.p.a_q, w.q_a_layernorm, eps, dc_q, dc_q);
        ops::linear_backward(ctx, dc_q, w.q_a_proj, dx, 1.0f);
    } else {
        ops::linear_backward(ctx, dq, w.q_proj, dx, 1.0f);
        lora_backward(ctx, host.q, w.lora_views.q, batch, w.lora_rows, x, dq, dx);
    }
}

void attention_forward(const backend::Ctx& ctx,
                       const ModelConfig& cfg,
                       const LayerSpec& spec,
                       const MlaWeightViews& w,
                       const Tensor& x,
                       const AttnBatchViews& b,
                       Tensor& y,
                       const comm::Comm* tp) {
    detail::check_fresh("attention_forward", cfg, spec, w, x, b, &y, nullptr);
    const LoraSlots none;
    const LoraSlots& host = w.lora ? *w.lora : none;
    Scratch scratch(ctx);
    const detail::FreshCall c{
        ctx, cfg, spec, *b.batch, detail::fresh_positions(ctx, scratch, b), tp};
    detail::FreshActs a = detail::fresh_forward(c, scratch, w, x);
    if (spec.gated)  // u = o ⊙ σ(W_g x)
        ops::mul_inplace(ctx, a.o, a.g);
    ops::linear(ctx, a.o, w.o_proj, y);
    lora_forward(ctx, host.o, w.lora_views.o, *b.batch, w.lora_rows, a.o, y);
}

void attention_backward(const backend::Ctx& ctx,
                        const ModelConfig& cfg,
                        const LayerSpec& spec,
                        const MlaWeights& w,
                        const Tensor& x,
                        const SeqBatch& batch,
                        const Tensor& dy,
                        Tensor& dx,
                        const comm::Comm* tp) {
    attention_backward(
        ctx, cfg, spec, attention_views(w), x, AttnBatchViews{&batch, {}}, dy, dx, tp);
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
