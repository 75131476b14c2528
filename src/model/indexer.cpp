// The DSA lightning indexer (spec/model-math.md §5, DeepSeek-V3.2 `Indexer` with the rotate-half
// RoPE of upstream fix 8631a81): per query t and visible key s,
//   I(t, s) = Σ_j w_t,j · H_I^{-1/2} · d_I^{-1/2} · ReLU(q^I_t,j · k^I_s),
// and each query keeps its top-k keys. A group of queries' logits are one GEMM against the keys,
// the ReLU and head weighting one pass over them; the top-k a partial selection (nth_element on
// the values, then one pass for the keys). In fp32 there is no Hadamard rotation or FP8
// quantisation (the Hadamard is orthonormal, so q·k is unchanged without quantisation). Over a
// bf16 KV cache the scores run in bf16 instead (ops::indexer_scores_bf16, model/attention.cpp),
// where DeepSeek runs FP8: bf16 keeps an exponent per element, so there is no block scale for the
// Hadamard's outlier spreading to serve, and it is left out there too.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "hymoe/backend/ops.h"
#include "hymoe/backend/ops_attention.h"
#include "hymoe/backend/ops_kda.h"
#include "hymoe/core/error.h"
#include "hymoe/model/attention.h"
#include "hymoe/model/attention_views.h"

namespace hymoe::model {

namespace {

constexpr float indexer_k_norm_eps = 1e-6f;          // DS32 LayerNorm default
constexpr int64_t score_scratch = int64_t{1} << 20;  // floats of logits per GEMM of a query group
constexpr int select_bits = 11;                      // the top-k's histogram: 2048 buckets
constexpr int64_t select_buckets = int64_t{1} << select_bits;

// A score's histogram bucket: the top bits of its bits mapped to an unsigned order (larger score,
// larger or equal bucket; −0 and +0 alike).
int64_t bucket_of(float x) {
    const uint32_t u = float_bits(x == 0.0f ? 0.0f : x);
    return static_cast<int64_t>(((u >> 31) ? ~u : u | 0x80000000u) >> (32 - select_bits));
}

// st [n_k] = Σ_j w_j · ReLU(logits [j, ·]) over the n_head rows of logits [n_head, n_k], heads in
// order from 0. By tiles of 16 keys held in a local accumulator across the heads, a fixed-length
// loop g++ -O2 vectorises (no aliasing, no remainder in the tile body).
void fold_heads(const float* logits, const float* w, int64_t n_head, int64_t n_k, float* st) {
    constexpr int64_t tile = 16;
    int64_t s0 = 0;
    for (; s0 + tile <= n_k; s0 += tile) {
        float acc[tile] = {};
        for (int64_t j = 0; j < n_head; ++j) {
            const float wj = w[j];
            const float* lj = logits + j * n_k + s0;
            for (int64_t l = 0; l < tile; ++l)
                acc[l] += wj * std::max(lj[l], 0.0f);
        }
        std::copy(acc, acc + tile, st + s0);
    }
    for (int64_t s = s0; s < n_k; ++s) {
        float acc = 0.0f;
        for (int64_t j = 0; j < n_head; ++j)
            acc += w[j] * std::max(logits[j * n_k + s], 0.0f);
        st[s] = acc;
    }
}

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
    if (n_q == 0 || n_k == 0)
        return;
    // q [n_q, H_I, d_I] is q [n_q·H_I, d_I]: a group of queries is one GEMM against every key,
    // logits [group·H_I, n_k], folded into their score rows in one pass (ReLU, weight, sum).
    const int64_t group = std::clamp<int64_t>(score_scratch / (n_head * n_k), 1, n_q);
    std::vector<float> logits(static_cast<size_t>(group * n_head * n_k));
    const float* wp = w.ptr<float>();
    float* sp = scores.ptr<float>();
    for (int64_t t0 = 0; t0 < n_q; t0 += group) {
        const int64_t n_g = std::min(group, n_q - t0);
        ops::gemm(false,
                  true,
                  n_g * n_head,
                  n_k,
                  d_head,
                  1.0f,
                  q.ptr<float>() + t0 * n_head * d_head,
                  d_head,
                  k.ptr<float>(),
                  d_head,
                  0.0f,
                  logits.data(),
                  n_k);
        for (int64_t t = 0; t < n_g; ++t)
            fold_heads(logits.data() + t * n_head * n_k,
                       wp + (t0 + t) * n_head,
                       n_head,
                       n_k,
                       sp + (t0 + t) * n_k);
    }
}

void indexer_select(
    const Tensor& scores, int64_t pos_first, int64_t index_topk, int64_t* keep, int64_t* n_keep) {
    const int64_t n_q = scores.dim(0), n_k = scores.dim(1);
    HYMOE_CHECK(index_topk > 0 && pos_first + n_q <= n_k,
                "indexer_select: scores ",
                shape_string(scores.shape),
                " top-k ",
                index_topk,
                " first position ",
                pos_first);
    std::vector<float> cand(static_cast<size_t>(n_k));
    std::vector<int64_t> hist(select_buckets);
    for (int64_t i = 0; i < n_q; ++i) {
        const int64_t visible = pos_first + i + 1;  // causal: keys 0 .. pos_first + i
        const int64_t k = std::min(index_topk, visible);
        const float* x = scores.ptr<float>() + i * n_k;
        int64_t* out = keep + i * index_topk;
        // The k-th largest score t: a histogram of the scores' top bits finds its bucket, a
        // selection among that bucket's scores finds t. The kept keys are every key above t and
        // the first (smallest-index) keys equal to it: the strict order of ops::top_k (higher
        // score first, ties to the smaller index), so exactly its k; in key order.
        std::fill(hist.begin(), hist.end(), 0);
        for (int64_t s = 0; s < visible; ++s)
            ++hist[bucket_of(x[s])];
        int64_t b = select_buckets - 1, above = 0;  // above: keys in buckets over b
        while (above + hist[b] < k)
            above += hist[b--];
        int64_t n_cand = 0;
        for (int64_t s = 0; s < visible; ++s)
            if (bucket_of(x[s]) == b)
                cand[n_cand++] = x[s];
        const int64_t r = k - above;  // t is the r-th largest of the bucket
        std::nth_element(cand.begin(), cand.begin() + (n_cand - r), cand.begin() + n_cand);
        const float t = cand[n_cand - r];
        for (int64_t c = n_cand - r + 1; c < n_cand; ++c)
            above += cand[c] > t;
        int64_t ties = k - above, n = 0;  // keys equal to t to keep
        for (int64_t s = 0; s < visible; ++s)
            if (x[s] > t || (x[s] == t && ties-- > 0))
                out[n++] = s;
        n_keep[i] = k;
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
    std::vector<int64_t> keep(static_cast<size_t>(n_q * index_topk)), n_keep(n_q);
    indexer_select(scores, pos_first, index_topk, keep.data(), n_keep.data());
    for (int64_t i = 0; i < n_q; ++i)
        for (int64_t j = 0; j < n_keep[i]; ++j)
            mp[i * n_k + keep[i * index_topk + j]] = 0.0f;
}

}  // namespace hymoe::model
