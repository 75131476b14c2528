// ops::indexer_select and ops::indexer_mask (backend/ops_attention.h): the DSA indexer's causal
// top-k per query. Each row's k-th largest score t, then every key above t and the first
// (smallest-index) keys equal to it: the strict order of ops::top_k (higher score first, ties to
// the smaller index), so exactly its k, in key order. t by the AVX-512 kernel (indexer_topk.cpp:
// a bisection over the scores' order-mapped bits, 16 keys a compare) when detail::f32_avx512_on(),
// else by a histogram of the scores' top bits and a selection within the bucket of the k-th.
#include <algorithm>
#include <limits>
#include <vector>

#include "gemm_f32.h"
#include "hymoe/backend/ops.h"
#include "hymoe/backend/ops_attention.h"
#include "hymoe/core/error.h"
#include "hymoe/core/types.h"
#include "indexer_kernels.h"

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

// out [k] = the top k of x [0, n) in key order (k ≤ n), by the histogram; hist [select_buckets]
// and cand [n] scratch.
void select_row(const float* x, int64_t n, int64_t k, int64_t* out, int64_t* hist, float* cand) {
    std::fill(hist, hist + select_buckets, 0);
    for (int64_t s = 0; s < n; ++s)
        ++hist[bucket_of(x[s])];
    int64_t b = select_buckets - 1, above = 0;  // above: keys in buckets over b
    while (above + hist[b] < k)
        above += hist[b--];
    int64_t n_cand = 0;
    for (int64_t s = 0; s < n; ++s)
        if (bucket_of(x[s]) == b)
            cand[n_cand++] = x[s];
    const int64_t r = k - above;  // t is the r-th largest of the bucket
    std::nth_element(cand, cand + (n_cand - r), cand + n_cand);
    const float t = cand[n_cand - r];
    for (int64_t c = n_cand - r + 1; c < n_cand; ++c)
        above += cand[c] > t;
    int64_t ties = k - above, kept = 0;  // keys equal to t to keep
    for (int64_t s = 0; s < n; ++s)
        if (x[s] > t || (x[s] == t && ties-- > 0))
            out[kept++] = s;
}

}  // namespace

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
    const bool avx512 = detail::f32_avx512_on();
    std::vector<float> cand(static_cast<size_t>(avx512 ? 0 : n_k));
    std::vector<int64_t> hist(avx512 ? 0 : select_buckets);
    std::vector<uint32_t> u(static_cast<size_t>(avx512 ? n_k : 0));
    for (int64_t i = 0; i < n_q; ++i) {
        const int64_t visible = pos_first + i + 1;  // causal: keys 0 .. pos_first + i
        const int64_t k = std::min(index_topk, visible);
        const float* x = scores.ptr<float>() + i * n_k;
        if (avx512)
            detail::indexer_top_avx512(x, visible, k, keep + i * index_topk, u.data());
        else
            select_row(x, visible, k, keep + i * index_topk, hist.data(), cand.data());
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
