// The AVX-512-BF16 kernel of the DSA indexer's scores (backend/cpu/indexer_kernels.h). This file
// alone with linear_bf16.cpp is compiled with -mavx512f -mavx512bw -mavx512vl -mavx512bf16.
// A register tile is 8 heads × 2 key tiles (16 fp32 accumulators of 16 keys): each 64-byte pair
// row of a key tile is loaded once and meets the 8 heads' broadcast query pairs by VDPBF16PS; the
// ReLU and head weight fold into one score vector per key tile by fused multiply-adds.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "indexer_kernels.h"

namespace hymoe::ops::detail {

namespace {

// score[t] += Σ_{h<HB} w[h] · ReLU(q_h · keys of tile t) for the TB key tiles at k0 (tile stride
// tile_elems), heads h of q [HB, pairs] in order.
template <int HB, int TB>
void head_group(const uint32_t* q,
                const float* w,
                int64_t pairs,
                const uint16_t* k0,
                int64_t tile_elems,
                __m512* score) {
    __m512 acc[HB][TB];
#pragma GCC unroll 8
    for (int h = 0; h < HB; ++h)
#pragma GCC unroll 2
        for (int t = 0; t < TB; ++t)
            acc[h][t] = _mm512_setzero_ps();
    for (int64_t p = 0; p < pairs; ++p) {
        __m512bh kv[TB];
#pragma GCC unroll 2
        for (int t = 0; t < TB; ++t)
            kv[t] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(k0 + t * tile_elems + p * 32));
#pragma GCC unroll 8
        for (int h = 0; h < HB; ++h) {
            const auto qb =
                reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(q[h * pairs + p])));
#pragma GCC unroll 2
            for (int t = 0; t < TB; ++t)
                acc[h][t] = _mm512_dpbf16_ps(acc[h][t], kv[t], qb);
        }
    }
    const __m512 zero = _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int h = 0; h < HB; ++h) {
        const __m512 wh = _mm512_set1_ps(w[h]);
#pragma GCC unroll 2
        for (int t = 0; t < TB; ++t)
            score[t] = _mm512_fmadd_ps(_mm512_max_ps(acc[h][t], zero), wh, score[t]);
    }
}

// The scores of one query over TB key tiles from k0, stored to out (the last tile's first `last`
// lanes only).
template <int TB>
void key_tiles(const uint32_t* q,
               const float* w,
               int64_t n_head,
               int64_t pairs,
               const uint16_t* k0,
               float* out,
               int last) {
    const int64_t tile_elems = pairs * 32;
    __m512 score[TB];
#pragma GCC unroll 2
    for (int t = 0; t < TB; ++t)
        score[t] = _mm512_setzero_ps();
    int64_t j = 0;
    for (; j + 8 <= n_head; j += 8)
        head_group<8, TB>(q + j * pairs, w + j, pairs, k0, tile_elems, score);
    for (; j < n_head; ++j)
        head_group<1, TB>(q + j * pairs, w + j, pairs, k0, tile_elems, score);
#pragma GCC unroll 2
    for (int t = 0; t + 1 < TB; ++t)
        _mm512_storeu_ps(out + 16 * t, score[t]);
    _mm512_mask_storeu_ps(
        out + 16 * (TB - 1), static_cast<__mmask16>((1u << last) - 1), score[TB - 1]);
}

}  // namespace

void indexer_scores_avx512(const uint32_t* q,
                           const float* w,
                           int64_t n_q,
                           int64_t n_head,
                           int64_t pairs,
                           const uint16_t* keys,
                           int64_t n_k,
                           float* scores,
                           int64_t ld_s) {
    const int64_t n_tiles = (n_k + 15) / 16, tile_elems = pairs * 32;
    const int last = static_cast<int>(n_k - 16 * (n_tiles - 1));  // keys in the last tile, 1..16
    for (int64_t i = 0; i < n_q; ++i) {
        const uint32_t* qi = q + i * n_head * pairs;
        const float* wi = w + i * n_head;
        float* si = scores + i * ld_s;
        int64_t t = 0;
        for (; t + 2 < n_tiles; t += 2)
            key_tiles<2>(qi, wi, n_head, pairs, keys + t * tile_elems, si + 16 * t, 16);
        if (n_tiles - t == 2)
            key_tiles<2>(qi, wi, n_head, pairs, keys + t * tile_elems, si + 16 * t, last);
        else if (n_tiles - t == 1)
            key_tiles<1>(qi, wi, n_head, pairs, keys + t * tile_elems, si + 16 * t, last);
    }
}

}  // namespace hymoe::ops::detail
