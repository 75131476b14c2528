// The per-token projections of an MLA/DSA layer (mla_project.h): query, latent and rope key of
// the new tokens of a call, all sequences at once.
#include "mla_project.h"

#include <algorithm>

#include "hymoe/backend/ops.h"
#include "hymoe/model/lora.h"

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

Projected mla_project(const ModelConfig& cfg,
                      const MlaWeights& w,
                      const Tensor& x,
                      const SeqBatch& batch,
                      const std::vector<int64_t>& pos,
                      bool keep_pre_norm) {
    const MlaDims m = mla_dims(cfg);
    const int64_t n_tok = x.dim(0);
    const float eps = static_cast<float>(cfg.mla.norm_eps);
    Projected p;
    p.q = Buffer(DType::f32, {n_tok, m.n_head * m.d_qk()});
    if (m.r_q > 0) {
        p.c_q = Buffer(DType::f32, {n_tok, m.r_q});
        ops::linear(x, w.q_a_proj.view(), p.c_q.view());
        if (keep_pre_norm) {
            p.a_q = Buffer(DType::f32, {n_tok, m.r_q});
            std::copy_n(p.c_q.ptr<float>(), n_tok * m.r_q, p.a_q.ptr<float>());
        }
        ops::rms_norm(p.c_q.view(), w.q_a_layernorm.view(), eps, p.c_q.view());
        ops::linear(p.c_q.view(), w.q_b_proj.view(), p.q.view());
        lora_forward(w.lora.q, batch, p.c_q.view(), p.q.view());
    } else {
        ops::linear(x, w.q_proj.view(), p.q.view());
        lora_forward(w.lora.q, batch, x, p.q.view());
    }
    Buffer kv(DType::f32, {n_tok, m.d_lat()});
    ops::linear(x, w.kv_a_proj_with_mqa.view(), kv.view());
    lora_forward(w.lora.kv, batch, x, kv.view());
    p.c_kv = Buffer(DType::f32, {n_tok, m.r_kv});
    p.k_r = Buffer(DType::f32, {n_tok, m.d_r});
    for (int64_t t = 0; t < n_tok; ++t) {
        const float* row = kv.ptr<float>() + t * m.d_lat();
        std::copy(row, row + m.r_kv, p.c_kv.ptr<float>() + t * m.r_kv);
        std::copy(row + m.r_kv, row + m.d_lat(), p.k_r.ptr<float>() + t * m.d_r);
    }
    if (keep_pre_norm) {
        p.a_kv = Buffer(DType::f32, {n_tok, m.r_kv});
        std::copy_n(p.c_kv.ptr<float>(), n_tok * m.r_kv, p.a_kv.ptr<float>());
    }
    ops::rms_norm(p.c_kv.view(), w.kv_a_layernorm.view(), eps, p.c_kv.view());
    if (!cfg.mla.nope) {
        const ops::RopeFreqs freqs = mla_rope_freqs(cfg.mla);
        ops::rope(p.q.ptr<float>() + m.d_n,
                  n_tok,
                  m.n_head,
                  m.n_head * m.d_qk(),
                  m.d_qk(),
                  pos.data(),
                  freqs,
                  true);
        ops::rope(p.k_r.ptr<float>(), n_tok, 1, m.d_r, m.d_r, pos.data(), freqs, true);
    }
    return p;
}

}  // namespace hymoe::model::detail
