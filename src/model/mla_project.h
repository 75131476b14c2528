// The per-token projections of an MLA/DSA layer (spec/model-math.md §4), shared by
// attention_forward and the forward recompute of attention_backward so that both see the same
// values: query (through the latent when r_q > 0), latent c_kv and rope key k_r, with their LoRA
// adapters, RMSNorms and interleaved RoPE. Every step is an op on the caller's Ctx (the host form
// below runs the view form on the CPU context). Private to src/model.
#pragma once

#include <cstdint>
#include <vector>

#include "hymoe/backend/ctx.h"
#include "hymoe/model/attention.h"
#include "hymoe/model/attention_views.h"
#include "hymoe/tensor/tensor.h"

namespace hymoe::model::detail {

struct MlaDims {
    int64_t d, n_head, d_n, d_r, d_v, r_q, r_kv;
    int64_t d_qk() const { return d_n + d_r; }    // per-head query width
    int64_t d_kvb() const { return d_n + d_v; }   // per-head rows of kv_b_proj
    int64_t d_lat() const { return r_kv + d_r; }  // cached latent entry [c_kv | k_r]
};

MlaDims mla_dims(const ModelConfig& cfg);

// The new tokens' projections, all sequences at once.
struct Projected {
    Buffer c_q;   // [n_tok, r_q]          after q_a_layernorm (r_q > 0)
    Buffer q;     // [n_tok, H·(d_n+d_r)]  per head [q_n | q_r], q_r rotated
    Buffer c_kv;  // [n_tok, r_kv]         after kv_a_layernorm
    Buffer k_r;   // [n_tok, d_r]          rotated
    Buffer a_q;   // [n_tok, r_q]          before q_a_layernorm (keep_pre_norm, r_q > 0)
    Buffer a_kv;  // [n_tok, r_kv]         before kv_a_layernorm (keep_pre_norm)
};

// The same projections into tensors on ctx's device, written in place: q, c_kv, k_r always, c_q
// when r_q > 0; a_q (r_q > 0) and a_kv only when they are not empty views. x [n_tok, d] and
// pos [n_tok] int64 on ctx's device too.
struct ProjectedViews {
    Tensor c_q, q, c_kv, k_r, a_q, a_kv;  // shapes as Projected's
};
void mla_project(const backend::Ctx& ctx,
                 const ModelConfig& cfg,
                 const MlaWeightViews& w,
                 const Tensor& x,
                 const SeqBatch& batch,
                 const Tensor& pos,
                 ProjectedViews out);

// keep_pre_norm: also keep the RMSNorms' inputs a_q, a_kv (what their backward needs).
Projected mla_project(const ModelConfig& cfg,
                      const MlaWeights& w,
                      const Tensor& x,  // [n_tok, d]
                      const SeqBatch& batch,
                      const std::vector<int64_t>& pos,  // [n_tok]
                      bool keep_pre_norm = false);

}  // namespace hymoe::model::detail
