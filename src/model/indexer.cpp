// The DSA lightning indexer's inputs (spec/model-math.md §5, DeepSeek-V3.2 `Indexer` with the
// rotate-half RoPE of upstream fix 8631a81): per token the queries q^I = wq_b c_q, the one key
// k^I = LayerNorm(wk x) and the head weights w = weights_proj x · H_I^{-1/2} · d_I^{-1/2}, each
// step an op on the caller's Ctx. Per query t and visible key s the scores are then
//   I(t, s) = Σ_j w_t,j · ReLU(q^I_t,j · k^I_s),
// and each query keeps its top-k keys (ops::indexer_scores, indexer_select, indexer_mask:
// backend/ops_attention.h). In fp32 there is no Hadamard rotation or FP8 quantisation (the
// Hadamard is orthonormal, so q·k is unchanged without quantisation). Over a bf16 KV cache the
// scores run in bf16 instead (ops::indexer_scores_bf16, model/attention.cpp), where DeepSeek runs
// FP8: bf16 keeps an exponent per element, so there is no block scale for the Hadamard's outlier
// spreading to serve, and it is left out there too.
#include <cmath>
#include <vector>

#include "hymoe/backend/ops.h"
#include "hymoe/backend/ops_attention.h"
#include "hymoe/backend/ops_kda.h"
#include "hymoe/core/error.h"
#include "hymoe/model/attention.h"
#include "hymoe/model/attention_views.h"

namespace hymoe::model {

namespace {

constexpr float indexer_k_norm_eps = 1e-6f;  // DS32 LayerNorm default
}  // namespace

void indexer_project(const backend::Ctx& ctx,
                     const ModelConfig& cfg,
                     const IndexerWeightViews& w,
                     const Tensor& x,
                     const Tensor& c_q,
                     const Tensor& pos,
                     Tensor& q,
                     Tensor& k,
                     Tensor& w_out) {
    const int64_t n_tok = x.dim(0);
    const int64_t n_head = cfg.indexer.n_head, d_head = cfg.indexer.head_dim;
    HYMOE_CHECK(c_q.dim(0) == n_tok && pos.numel() == n_tok,
                "indexer_project: x ",
                shape_string(x.shape),
                " c_q ",
                shape_string(c_q.shape),
                " positions ",
                pos.numel());
    HYMOE_CHECK(cfg.mla.qk_rope_head_dim <= d_head,
                "indexer_project: rope dims ",
                cfg.mla.qk_rope_head_dim,
                " exceed the indexer head dim ",
                d_head);
    ops::linear(ctx, c_q, w.wq_b, q);
    ops::linear(ctx, x, w.wk, k);
    ops::layer_norm(ctx, k, w.k_norm_weight, w.k_norm_bias, indexer_k_norm_eps, k);
    // rope first: dims [0, d_r) of each head, pairs (x_i, x_{i + d_r/2})
    const ops::RopeFreqs freqs = mla_rope_freqs(cfg.mla);
    ops::rope(ctx, q, 0, n_head, d_head, pos, freqs, false);
    ops::rope(ctx, k, 0, 1, d_head, pos, freqs, false);
    ops::linear(ctx, x, w.weights_proj, w_out);
    const int64_t scale_heads = cfg.indexer.scale_heads > 0 ? cfg.indexer.scale_heads : n_head;
    ops::scale_inplace(
        ctx, w_out, static_cast<float>(1.0 / std::sqrt(static_cast<double>(scale_heads * d_head))));
}

IndexerInputs indexer_project(const ModelConfig& cfg,
                              const IndexerWeights& w,
                              const Tensor& x,
                              const Tensor& c_q,
                              const std::vector<int64_t>& pos) {
    const int64_t n_tok = x.dim(0);
    const int64_t n_head = cfg.indexer.n_head, d_head = cfg.indexer.head_dim;
    IndexerInputs in{Buffer(DType::f32, {n_tok, n_head * d_head}),
                     Buffer(DType::f32, {n_tok, d_head}),
                     Buffer(DType::f32, {n_tok, n_head})};
    const Tensor pos_view{const_cast<int64_t*>(pos.data()),
                          DType::i64,
                          Device::cpu,
                          {static_cast<int64_t>(pos.size())}};
    const IndexerWeightViews views{w.wq_b.view(),
                                   w.wk.view(),
                                   w.k_norm_weight.view(),
                                   w.k_norm_bias.view(),
                                   w.weights_proj.view()};
    indexer_project(
        backend::cpu_ctx(), cfg, views, x, c_q, pos_view, in.q.view(), in.k.view(), in.w.view());
    return in;
}

}  // namespace hymoe::model
