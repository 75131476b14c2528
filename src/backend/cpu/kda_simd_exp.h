// The KDA kernels' e^x for x ≤ 0 (kda_simd.h states its error bound), shared by kda_simd.cpp and
// kda_simd_decay.cpp: Cody-Waite range reduction x = n·ln2 + r and the Cephes expf polynomial, as
// one AVX-512 vector body and a scalar body with the same polynomial; and the run-time choice
// between AVX-512 and portable bodies. Private to backend/cpu.
#pragma once

#include <algorithm>
#include <cmath>
#include <immintrin.h>

namespace hymoe::ops::kda_simd {

constexpr float exp_lo = -104.0f;  // e^{−104} is below the smallest subnormal: 0 from here
constexpr float log2e = 1.44269504088896341f;
constexpr float ln2_hi = 0.693359375f;  // ln 2 = ln2_hi + ln2_lo, ln2_hi exact in 9 bits
constexpr float ln2_lo = -2.12194440e-4f;
constexpr float p0 = 1.9875691500e-4f;  // Cephes expf: e^r ≈ 1 + r + r²·P(r)
constexpr float p1 = 1.3981999507e-3f;
constexpr float p2 = 8.3334519073e-3f;
constexpr float p3 = 4.1665795894e-2f;
constexpr float p4 = 1.6666665459e-1f;
constexpr float p5 = 5.0000001201e-1f;

inline bool have_avx512() {
    static const bool yes = __builtin_cpu_supports("avx512f");
    return yes;
}

inline float exp_scalar(float x) {
    x = std::max(x, exp_lo);
    const float n = std::floor(x * log2e + 0.5f);
    const float r = (x - n * ln2_hi) - n * ln2_lo;
    const float p = ((((p0 * r + p1) * r + p2) * r + p3) * r + p4) * r + p5;
    return std::ldexp(p * r * r + r + 1.0f, static_cast<int>(n));
}

inline __attribute__((target("avx512f"))) __m512 exp_avx512(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(exp_lo));
    const __m512 n =
        _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(log2e)), _MM_FROUND_TO_NEAREST_INT);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(ln2_hi), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(ln2_lo), r);
    __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(p0), r, _mm512_set1_ps(p1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(p2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(p3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(p4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(p5));
    const __m512 y =
        _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(y, n);  // y · 2^n, subnormal or 0 on underflow
}

// The mask of the first min(16, left) lanes.
inline __mmask16 lanes(int64_t left) {
    return left >= 16 ? 0xffff : static_cast<__mmask16>((1u << left) - 1);
}

}  // namespace hymoe::ops::kda_simd
