// A 16 × 16 transpose of 32-bit lanes in AVX-512 registers, shared by the kernels that pack
// weight panels (gemm_avx512.cpp: fp32 B [n, k]; linear_bf16.cpp: bf16 pairs, moved as bits) and
// the KDA scan's transposed decay rows (kda_simd_decay.cpp). Call only from code compiled with
// -mavx512f or from functions with target("avx512f").
#pragma once

#include <immintrin.h>

namespace hymoe::ops::detail {

// r [16][16] = its transpose (r[i] lane l ← r[l] lane i): unpack pairs, then 4 × 4 blocks.
inline __attribute__((target("avx512f"))) void transpose16(__m512 r[16]) {
    __m512 t[16];
#pragma GCC unroll 8
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
#pragma GCC unroll 4
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
        r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xee);
        r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xee);
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
        t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
        t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xdd);
        t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
        t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xdd);
    }
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) {
        r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
    }
}

}  // namespace hymoe::ops::detail
