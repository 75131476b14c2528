// The DSA lightning indexer (spec/model-math.md §5, DeepSeek-V3.2 `Indexer` with the rotate-half
// RoPE of upstream fix 8631a81): per query t and visible key s,
//   I(t, s) = Σ_j w_t,j · H_I^{-1/2} · d_I^{-1/2} · ReLU(q^I_t,j · k^I_s),
// and each query keeps its top-k keys. In fp32 there is no Hadamard rotation or FP8 quantisation
// (the Hadamard is orthonormal, so q·k is unchanged without quantisation).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "hymoe/backend/ops.h"
#include "hymoe/core/error.h"
#include "hymoe/model/attention.h"

namespace hymoe::model {

namespace {

constexpr float indexer_k_norm_eps = 1e-6f;  // DS32 LayerNorm default

}  // namespace

IndexerInputs indexer_project(const ModelConfig& cfg,
                              const IndexerWeights& w,
                              const Tensor& x,
                              const Tensor& c_q,
                              const std::vector<int64_t>& pos) {
    const int64_t n_tok = x.dim(0);
    const int64_t n_head = cfg.indexer.n_head, d_head = cfg.indexer.head_dim;
    HYMOE_CHECK(c_q.dim(0) == n_tok && static_cast<int64_t>(pos.size()) == n_tok,
                "indexer_project: x ",
                shape_string(x.shape),
                " c_q ",
                shape_string(c_q.shape),
                " positions ",
                pos.size());
    HYMOE_CHECK(cfg.mla.qk_rope_head_dim <= d_head,
                "indexer_project: rope dims ",
                cfg.mla.qk_rope_head_dim,
                " exceed the indexer head dim ",
                d_head);
    IndexerInputs in{Buffer(DType::f32, {n_tok, n_head * d_head}),
                     Buffer(DType::f32, {n_tok, d_head}),
                     Buffer(DType::f32, {n_tok, n_head})};
    ops::linear(c_q, w.wq_b.view(), in.q.view());
    ops::linear(x, w.wk.view(), in.k.view());
    ops::layer_norm(
        in.k.view(), w.k_norm_weight.view(), w.k_norm_bias.view(), indexer_k_norm_eps, in.k.view());
    // rope first: dims [0, d_r) of each head, pairs (x_i, x_{i + d_r/2})
    const ops::RopeFreqs freqs = mla_rope_freqs(cfg.mla);
    ops::rope(in.q.ptr<float>(), n_tok, n_head, n_head * d_head, d_head, pos.data(), freqs, false);
    ops::rope(in.k.ptr<float>(), n_tok, 1, d_head, d_head, pos.data(), freqs, false);
    ops::linear(x, w.weights_proj.view(), in.w.view());
    const int64_t scale_heads = cfg.indexer.scale_heads > 0 ? cfg.indexer.scale_heads : n_head;
    const float scale =
        static_cast<float>(1.0 / std::sqrt(static_cast<double>(scale_heads * d_head)));
    float* wp = in.w.ptr<float>();
    for (int64_t i = 0; i < n_tok * n_head; ++i)
        wp[i] *= scale;
    return in;
}

void indexer_scores(const Tensor& q, const Tensor& w, const Tensor& k, Tensor& scores) {
    const int64_t n_q = q.dim(0), n_head = w.dim(1), d_head = k.dim(1), n_k = k.dim(0);
    HYMOE_CHECK(w.dim(0) == n_q && q.dim(1) == n_head * d_head && scores.dim(0) == n_q &&
                    scores.dim(1) == n_k,
                "indexer_scores: q ",
                shape_string(q.shape),
                " w ",
                shape_string(w.shape),
                " k ",
                shape_string(k.shape),
                " scores ",
                shape_string(scores.shape));
    // per query, logits [H_I, n_k] (one query at a time keeps scratch at H_I × n_k)
    std::vector<float> logits(static_cast<size_t>(n_head * n_k));
    const float* wp = w.ptr<float>();
    float* sp = scores.ptr<float>();
    std::fill(sp, sp + n_q * n_k, 0.0f);
    for (int64_t t = 0; t < n_q; ++t) {
        ops::gemm(false,
                  true,
                  n_head,
                  n_k,
                  d_head,
                  1.0f,
                  q.ptr<float>() + t * n_head * d_head,
                  d_head,
                  k.ptr<float>(),
                  d_head,
                  0.0f,
                  logits.data(),
                  n_k);
        float* st = sp + t * n_k;
        for (int64_t j = 0; j < n_head; ++j) {
            const float wj = wp[t * n_head + j];
            const float* lj = logits.data() + j * n_k;
            for (int64_t s = 0; s < n_k; ++s)
                st[s] += wj * std::max(lj[s], 0.0f);
        }
    }
}

void indexer_mask(const Tensor& scores, int64_t pos_first, int64_t index_topk, Tensor& mask) {
    const int64_t n_q = scores.dim(0), n_k = scores.dim(1);
    HYMOE_CHECK(mask.shape == scores.shape && index_topk > 0 && pos_first + n_q <= n_k,
                "indexer_mask: scores ",
                shape_string(scores.shape),
                " mask ",
                shape_string(mask.shape),
                " top-k ",
                index_topk,
                " first position ",
                pos_first);
    float* mp = mask.ptr<float>();
    std::fill(mp, mp + n_q * n_k, -std::numeric_limits<float>::infinity());
    std::vector<int64_t> keep(static_cast<size_t>(std::min(index_topk, n_k)));
    for (int64_t i = 0; i < n_q; ++i) {
        const int64_t visible = pos_first + i + 1;  // causal: keys 0 .. pos_first + i
        const int64_t k = std::min(index_topk, visible);
        ops::top_k(scores.ptr<float>() + i * n_k, visible, k, keep.data());
        for (int64_t j = 0; j < k; ++j)
            mp[i * n_k + keep[j]] = 0.0f;
    }
}

}  // namespace hymoe::model
