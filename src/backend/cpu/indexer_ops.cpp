// ops::IndexerKeys and ops::indexer_scores_bf16 (backend/ops.h): the keys packed in tiles of 16,
// the queries rounded to bf16 pairs, then the AVX-512-BF16 kernel (indexer_bf16.cpp) when
// ops::weight_kernel() is avx512_bf16, else the portable loop below (the same order: per pair,
// dim 2p+1's product then 2p's; heads summed in order by fused multiply-adds).
#include <algorithm>
#include <cmath>
#include <vector>

#include "hymoe/backend/ops.h"
#include "hymoe/core/error.h"
#include "indexer_kernels.h"

namespace hymoe::ops {

namespace {

// The key element (s, e) of the tiles.
float key_at(const IndexerKeys& k, int64_t s, int64_t e) {
    return bf16_to_float(k.tile(s / 16)[(e / 2) * 32 + (s % 16) * 2 + e % 2]);
}

void scores_portable(const std::vector<uint32_t>& q2,  // [n_q, n_head, pairs] bf16 pairs
                     const float* w,
                     int64_t n_q,
                     int64_t n_head,
                     const IndexerKeys& k,
                     int64_t n_k,
                     float* scores,
                     int64_t ld_s) {
    const int64_t pairs = k.pairs();
    for (int64_t i = 0; i < n_q; ++i)
        for (int64_t s = 0; s < n_k; ++s) {
            float score = 0.0f;
            for (int64_t j = 0; j < n_head; ++j) {
                const uint32_t* qj = q2.data() + (i * n_head + j) * pairs;
                float acc = 0.0f;
                for (int64_t p = 0; p < pairs; ++p) {  // bf16 products are exact in fp32
                    acc +=
                        bf16_to_float(static_cast<uint16_t>(qj[p] >> 16)) * key_at(k, s, 2 * p + 1);
                    acc += bf16_to_float(static_cast<uint16_t>(qj[p])) * key_at(k, s, 2 * p);
                }
                score = std::fma(std::max(acc, 0.0f), w[i * n_head + j], score);
            }
            scores[i * ld_s + s] = score;
        }
}

}  // namespace

IndexerKeys::IndexerKeys(int64_t n, int64_t d)
    : n_(n), d_(d), data_(static_cast<size_t>((n + 15) / 16 * ((d + 1) / 2) * 32), 0) {}

void IndexerKeys::put(int64_t i, const uint16_t* k) {
    uint16_t* base = data_.data() + (i / 16) * pairs() * 32 + (i % 16) * 2;
    for (int64_t e = 0; e < d_; ++e)
        base[(e / 2) * 32 + e % 2] = k[e];
}

void IndexerKeys::put(int64_t i, const float* k) {
    uint16_t* base = data_.data() + (i / 16) * pairs() * 32 + (i % 16) * 2;
    for (int64_t e = 0; e < d_; ++e)
        base[(e / 2) * 32 + e % 2] = float_to_bf16(k[e]);
}

void indexer_scores_bf16(const float* q,
                         const float* w,
                         int64_t n_q,
                         int64_t n_head,
                         const IndexerKeys& k,
                         int64_t n_k,
                         float* scores,
                         int64_t ld_s) {
    HYMOE_CHECK(n_k <= k.n() && ld_s >= n_k && n_head > 0,
                "indexer_scores_bf16: ",
                n_k,
                " of ",
                k.n(),
                " keys, score stride ",
                ld_s,
                ", ",
                n_head,
                " heads");
    if (n_q == 0 || n_k == 0)
        return;
    const int64_t d = k.d(), pairs = k.pairs();
    std::vector<uint32_t> q2(static_cast<size_t>(n_q * n_head * pairs), 0);  // dim 2p low
    for (int64_t r = 0; r < n_q * n_head; ++r)
        for (int64_t e = 0; e < d; ++e)
            q2[r * pairs + e / 2] |= uint32_t{float_to_bf16(q[r * d + e])} << (16 * (e % 2));
    if (weight_kernel() == WeightKernel::avx512_bf16)
        detail::indexer_scores_avx512(
            q2.data(), w, n_q, n_head, pairs, k.tile(0), n_k, scores, ld_s);
    else
        scores_portable(q2, w, n_q, n_head, k, n_k, scores, ld_s);
}

}  // namespace hymoe::ops
