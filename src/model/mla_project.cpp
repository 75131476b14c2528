// The per-token projections of an MLA/DSA layer (mla_project.h): query, latent and rope key of
// the new tokens of a call, all sequences at once.
#include "mla_project.h"

#include "hymoe/backend/ops.h"
#include "hymoe/backend/ops_attention.h"
#include "hymoe/model/lora.h"
#include "hymoe/model/lora_views.h"

namespace hymoe::model::detail {

MlaDims mla_dims(const ModelConfig& cfg) {
    const MlaConfig& m = cfg.mla;
    return {cfg.hidden_size,
            m.n_head,
            m.qk_nope_head_dim,
            m.qk_rope_head_dim,
            m.v_head_dim,
            m.q_lora_rank,
            m.kv_lora_rank};
}

void mla_project(const backend::Ctx& ctx,
                 const ModelConfig& cfg,
                 const MlaWeightViews& w,
                 const Tensor& x,
                 const SeqBatch& batch,
                 const Tensor& pos,
                 ProjectedViews out) {
    const MlaDims m = mla_dims(cfg);
    const int64_t n_tok = x.dim(0);
    const float eps = static_cast<float>(cfg.mla.norm_eps);
    const LoraSlots none;
    const LoraSlots& lora = w.lora ? *w.lora : none;
    if (m.r_q > 0) {
        ops::linear(ctx, x, w.q_a_proj, out.c_q);
        if (out.a_q.data != nullptr)
            ops::copy_cols(ctx, out.c_q, 0, out.a_q);
        ops::rms_norm(ctx, out.c_q, w.q_a_layernorm, eps, out.c_q);
        ops::linear(ctx, out.c_q, w.q_b_proj, out.q);
        lora_forward(ctx, lora.q, w.lora_views.q, batch, w.lora_rows, out.c_q, out.q);
    } else {
        ops::linear(ctx, x, w.q_proj, out.q);
        lora_forward(ctx, lora.q, w.lora_views.q, batch, w.lora_rows, x, out.q);
    }
    backend::Scratch scratch(ctx);
    Tensor kv = scratch(DType::f32, {n_tok, m.d_lat()});  // [n_tok, r_kv + d_r]
    ops::linear(ctx, x, w.kv_a_proj_with_mqa, kv);
    lora_forward(ctx, lora.kv, w.lora_views.kv, batch, w.lora_rows, x, kv);  // onto [c_kv | k_r]
    ops::copy_cols(ctx, kv, 0, out.c_kv);
    ops::copy_cols(ctx, kv, m.r_kv, out.k_r);
    if (out.a_kv.data != nullptr)
        ops::copy_cols(ctx, out.c_kv, 0, out.a_kv);
    ops::rms_norm(ctx, out.c_kv, w.kv_a_layernorm, eps, out.c_kv);
    if (!cfg.mla.nope) {
        const ops::RopeFreqs freqs = mla_rope_freqs(cfg.mla);
        ops::rope(ctx, out.q, m.d_n, m.n_head, m.d_qk(), pos, freqs, true);
        ops::rope(ctx, out.k_r, 0, 1, m.d_r, pos, freqs, true);
    }
}

Projected mla_project(const ModelConfig& cfg,
                      const MlaWeights& w,
                      const Tensor& x,
                      const SeqBatch& batch,
                      const std::vector<int64_t>& pos,
                      bool keep_pre_norm) {
    const MlaDims m = mla_dims(cfg);
    const int64_t n_tok = x.dim(0);
    Projected p;
    p.q = Buffer(DType::f32, {n_tok, m.n_head * m.d_qk()});
    p.c_kv = Buffer(DType::f32, {n_tok, m.r_kv});
    p.k_r = Buffer(DType::f32, {n_tok, m.d_r});
    if (m.r_q > 0)
        p.c_q = Buffer(DType::f32, {n_tok, m.r_q});
    if (keep_pre_norm) {
        if (m.r_q > 0)
            p.a_q = Buffer(DType::f32, {n_tok, m.r_q});
        p.a_kv = Buffer(DType::f32, {n_tok, m.r_kv});
    }
    const Tensor pos_view{const_cast<int64_t*>(pos.data()), DType::i64, Device::cpu, {n_tok}};
    mla_project(
        backend::cpu_ctx(),
        cfg,
        attention_views(w),
        x,
        batch,
        pos_view,
        {p.c_q.view(), p.q.view(), p.c_kv.view(), p.k_r.view(), p.a_q.view(), p.a_kv.view()});
    return p;
}

}  // namespace hymoe::model::detail
