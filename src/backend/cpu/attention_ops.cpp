// The attention block's math kernels on the CPU (backend/ops_attention.h), moved here from the
// model blocks unchanged: one head's softmax attention (ops::attention_core) and the DSA indexer's
// causal top-k selection and mask (a histogram of the scores' top bits, then a selection within
// the bucket of the k-th score); the indexer's fp32 scores are in indexer_scores.cpp.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "hymoe/backend/ops.h"
#include "hymoe/backend/ops_attention.h"
#include "hymoe/core/error.h"
#include "hymoe/core/types.h"

namespace hymoe::ops {

namespace {

constexpr int select_bits = 11;  // the top-k's histogram: 2048 buckets
constexpr int64_t select_buckets = int64_t{1} << select_bits;

// A score's histogram bucket: the top bits of its bits mapped to an unsigned order (larger score,
// larger or equal bucket; −0 and +0 alike).
int64_t bucket_of(float x) {
    const uint32_t u = float_bits(x == 0.0f ? 0.0f : x);
    return static_cast<int64_t>(((u >> 31) ? ~u : u | 0x80000000u) >> (32 - select_bits));
}

}  // namespace

void attention_core(
    const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, float tau, Tensor& o) {
    const int64_t n_q = q.dim(0), n_k = k.dim(0), d_qk = q.dim(1), d_v = v.dim(1);
    HYMOE_CHECK(k.dim(1) == d_qk && v.dim(0) == n_k && mask.dim(0) == n_q && mask.dim(1) == n_k &&
                    o.dim(0) == n_q && o.dim(1) == d_v,
                "attention_core: q ",
                shape_string(q.shape),
                " k ",
                shape_string(k.shape),
                " v ",
                shape_string(v.shape),
                " mask ",
                shape_string(mask.shape),
                " o ",
                shape_string(o.shape));
    std::vector<float> p(static_cast<size_t>(n_q * n_k));
    ops::gemm(false,
              true,
              n_q,
              n_k,
              d_qk,
              tau,
              q.ptr<float>(),
              d_qk,
              k.ptr<float>(),
              d_qk,
              0.0f,
              p.data(),
              n_k);
    const float* mp = mask.ptr<float>();
    for (int64_t i = 0; i < n_q * n_k; ++i)
        p[i] += mp[i];
    ops::softmax_rows(p.data(), n_q, n_k);
    ops::gemm(false,
              false,
              n_q,
              d_v,
              n_k,
              1.0f,
              p.data(),
              n_k,
              v.ptr<float>(),
              d_v,
              0.0f,
              o.ptr<float>(),
              d_v);
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

}  // namespace hymoe::ops
