// ops::indexer_scores (backend/ops_attention.h), the DSA indexer's fp32 scores: the fused AVX-512
// kernel (indexer_f32.cpp) when detail::f32_avx512_on(), else a group of queries' logits as one
// GEMM against the keys and the ReLU and head weighting one pass over them (the same bits as the
// fused kernel wherever ops::gemm runs hymoe's AVX-512 GEMM).
#include <algorithm>
#include <vector>

#include "gemm_f32.h"
#include "hymoe/backend/ops.h"
#include "hymoe/backend/ops_attention.h"
#include "hymoe/core/error.h"
#include "indexer_kernels.h"

namespace hymoe::ops {

namespace {

constexpr int64_t score_scratch = int64_t{1} << 20;  // floats of logits per GEMM of a query group

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

// scores = the fp32 indexer scores as GEMMs of query groups, each folded by fold_heads.
void gemm_scores(const Tensor& q, const Tensor& w, const Tensor& k, Tensor& scores) {
    const int64_t n_q = q.dim(0), n_head = w.dim(1), d_head = k.dim(1), n_k = k.dim(0);
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

}  // namespace

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
    if (detail::f32_avx512_on())
        detail::indexer_scores_f32_avx512(q.ptr<float>(),
                                          w.ptr<float>(),
                                          n_q,
                                          n_head,
                                          d_head,
                                          k.ptr<float>(),
                                          n_k,
                                          scores.ptr<float>(),
                                          n_k);
    else
        gemm_scores(q, w, k, scores);
}

}  // namespace hymoe::ops
