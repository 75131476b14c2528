// The AVX-512 top-k of one row of DSA indexer scores (backend/cpu/indexer_kernels.h), behind
// ops::indexer_select (indexer_select.cpp). The scores map to unsigned keys u in the same order
// (the bits of x + 0, so −0 is +0; negatives' bits inverted, positives' sign bit set); the k-th
// largest u is found bit by bit from the top, each bit one vector pass counting the keys at or
// above the candidate, 16 a compare (until exactly k are: then it is their least, one more pass);
// then one pass keeps the keys above it and the first ones equal to it, their indices compressed
// into place. Compiled with -mavx512f -mavx512bw
// -mavx512vl; callers check detail::f32_avx512_on() first. g++ 12's AVX-512 headers start
// vectors as `__Y = __Y`, which -Wuninitialized reports at every inlined use: silenced here.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "indexer_kernels.h"

namespace hymoe::ops::detail {

namespace {

__mmask16 first_lanes(int64_t n) {  // lanes [0, n) of 16
    return n >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << n) - 1);
}

// #{i < n : u[i] ≥ c}
int64_t count_at_least(const uint32_t* u, int64_t n, uint32_t c) {
    const __m512i cv = _mm512_set1_epi32(static_cast<int>(c)), one = _mm512_set1_epi32(1);
    __m512i count = _mm512_setzero_si512();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __mmask16 ge = _mm512_cmpge_epu32_mask(_mm512_loadu_si512(u + i), cv);
        count = _mm512_mask_add_epi32(count, ge, count, one);
    }
    if (i < n) {
        const __mmask16 tail = first_lanes(n - i);
        const __mmask16 ge =
            _mm512_mask_cmpge_epu32_mask(tail, _mm512_maskz_loadu_epi32(tail, u + i), cv);
        count = _mm512_mask_add_epi32(count, ge, count, one);
    }
    return _mm512_reduce_add_epi32(count);
}

// min {u[i] : i < n, u[i] ≥ c} (some u[i] ≥ c)
uint32_t least_at_least(const uint32_t* u, int64_t n, uint32_t c) {
    const __m512i cv = _mm512_set1_epi32(static_cast<int>(c));
    __m512i least = _mm512_set1_epi32(-1);
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = first_lanes(n - i);
        const __m512i v = _mm512_maskz_loadu_epi32(m, u + i);
        least = _mm512_mask_min_epu32(least, _mm512_mask_cmpge_epu32_mask(m, v, cv), least, v);
    }
    return static_cast<uint32_t>(_mm512_reduce_min_epu32(least));
}

}  // namespace

void indexer_top_avx512(const float* x, int64_t n, int64_t k, int64_t* out, uint32_t* u) {
    const __m512 zero = _mm512_setzero_ps();
    const __m512i sign = _mm512_set1_epi32(static_cast<int>(0x80000000u));
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = first_lanes(n - i);
        const __m512i b = _mm512_castps_si512(_mm512_add_ps(_mm512_maskz_loadu_ps(m, x + i), zero));
        const __m512i flip = _mm512_or_si512(_mm512_srai_epi32(b, 31), sign);
        _mm512_mask_storeu_epi32(u + i, m, _mm512_xor_si512(b, flip));
    }
    uint32_t t = 0;  // the largest value with at least k keys at or above it: the k-th largest
    for (int bit = 31; bit >= 0; --bit) {
        const uint32_t c = t | (uint32_t{1} << bit);
        const int64_t at_least = count_at_least(u, n, c);
        if (at_least == k) {  // exactly k keys at or above c: the k-th largest is their least
            t = least_at_least(u, n, c);
            break;
        }
        if (at_least > k)
            t = c;
    }
    int64_t ties = k - (t == UINT32_MAX ? 0 : count_at_least(u, n, t + 1));  // equal keys to keep
    const __m512i tv = _mm512_set1_epi32(static_cast<int>(t));
    const __m512i lanes_lo = _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0);
    const __m512i lanes_hi = _mm512_set_epi64(15, 14, 13, 12, 11, 10, 9, 8);
    int64_t kept = 0;
    for (int64_t i = 0; i < n && kept < k; i += 16) {
        const __mmask16 m = first_lanes(n - i);
        const __m512i v = _mm512_maskz_loadu_epi32(m, u + i);
        const auto gt = static_cast<unsigned>(_mm512_mask_cmpgt_epu32_mask(m, v, tv));
        auto eq = static_cast<unsigned>(_mm512_mask_cmpeq_epu32_mask(m, v, tv));
        unsigned take = gt;
        for (; eq != 0 && ties > 0; --ties) {  // the first `ties` equal keys, lowest lane first
            take |= eq & (~eq + 1);
            eq &= eq - 1;
        }
        if (take == 0)
            continue;
        const __m512i base = _mm512_set1_epi64(i);
        const auto lo = static_cast<__mmask8>(take), hi = static_cast<__mmask8>(take >> 8);
        const int n_lo = __builtin_popcount(lo), n_hi = __builtin_popcount(hi);
        _mm512_mask_storeu_epi64(out + kept,
                                 static_cast<__mmask8>((1u << n_lo) - 1),
                                 _mm512_maskz_compress_epi64(lo, _mm512_add_epi64(base, lanes_lo)));
        kept += n_lo;
        _mm512_mask_storeu_epi64(out + kept,
                                 static_cast<__mmask8>((1u << n_hi) - 1),
                                 _mm512_maskz_compress_epi64(hi, _mm512_add_epi64(base, lanes_hi)));
        kept += n_hi;
    }
}

}  // namespace hymoe::ops::detail
