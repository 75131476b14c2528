// glibc's expf in AVX-512 lanes (expf_avx512.h). Per lane, as __expf_fma does in double:
//   kd = fma(N/ln2, x, SHIFT), ki = bits(kd), kd −= SHIFT, r = fma(N/ln2, x, −kd),
//   s = bits(T[ki mod 32] + (ki << 47)), z = fma(C0, r, C1), y = fma(r, C2, 1),
//   y = fma(z, r², y), result (float)(y · s);
// no other product meets a sum here (nothing for the compiler to contract), so every rounding is
// libm's.
#include "expf_avx512.h"

#include <bit>
#include <climits>
#include <cmath>
#include <immintrin.h>

// g++ 12's AVX-512 intrinsics pass self-initialised placeholders as unused operands (GCC bug
// 105593), which -Wmaybe-uninitialized and -Wuninitialized report at every inlined use.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace hymoe::ops::detail {

namespace {

// __exp2f_data of glibc (e_exp2f_data.c): 2^(i/32) as the bits of a double less i << 47, then
// N/ln2, the scaled cubic's coefficients and the rounding shift 1.5 · 2^52.
alignas(64) constexpr uint64_t table[32] = {
    0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f, 0x3fef9301d0125b51,
    0x3fef72b83c7d517b, 0x3fef54873168b9aa, 0x3fef387a6e756238, 0x3fef1e9df51fdee1,
    0x3fef06fe0a31b715, 0x3feef1a7373aa9cb, 0x3feedea64c123422, 0x3feece086061892d,
    0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429, 0x3feea47eb03a5585,
    0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74, 0x3feea11473eb0187, 0x3feea589994cce13,
    0x3feeace5422aa0db, 0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d,
    0x3feee89f995ad3ad, 0x3feeff76f2fb5e47, 0x3fef199bdd85529c, 0x3fef3720dcef9069,
    0x3fef5818dcfba487, 0x3fef7c97337b9b5f, 0x3fefa4afa2a490da, 0x3fefd0765b6e4540};
constexpr uint64_t inv_ln2_n = 0x40471547652b82fe, c0 = 0x3ebc6af84b912394, c1 = 0x3f2ebfce50fac4f3,
                   c2 = 0x3f962e42ff0c52d6, shift = 0x4338000000000000;

bool cpu_avx512f() {
    static const bool yes = __builtin_cpu_supports("avx512f");
    return yes;
}

#define HYMOE_EXPF_TARGET __attribute__((target("avx512f")))

HYMOE_EXPF_TARGET __m256 expf8(__m256 x) {
    const __m512d xd = _mm512_cvtps_pd(x);
    const __m512d k = _mm512_set1_pd(std::bit_cast<double>(inv_ln2_n));
    const __m512d sh = _mm512_set1_pd(std::bit_cast<double>(shift));
    __m512d kd = _mm512_fmadd_pd(k, xd, sh);
    const __m512i ki = _mm512_castpd_si512(kd);
    kd = _mm512_sub_pd(kd, sh);
    const __m512d r = _mm512_fmsub_pd(k, xd, kd);
    const __m512i idx = _mm512_and_si512(ki, _mm512_set1_epi64(31));
    __m512i t = _mm512_i64gather_epi64(idx, reinterpret_cast<const long long*>(table), 8);
    t = _mm512_add_epi64(t, _mm512_slli_epi64(ki, 47));
    const __m512d s = _mm512_castsi512_pd(t);
    const __m512d z = _mm512_fmadd_pd(
        _mm512_set1_pd(std::bit_cast<double>(c0)), r, _mm512_set1_pd(std::bit_cast<double>(c1)));
    const __m512d r2 = _mm512_mul_pd(r, r);
    __m512d y = _mm512_fmadd_pd(r, _mm512_set1_pd(std::bit_cast<double>(c2)), _mm512_set1_pd(1.0));
    y = _mm512_fmadd_pd(z, r2, y);
    y = _mm512_mul_pd(y, s);
    return _mm512_cvtpd_ps(y);
}

HYMOE_EXPF_TARGET void expf_avx512(const float* x, bool negate, float* y, int64_t n) {
    const __m512i flip = _mm512_set1_epi32(negate ? INT32_MIN : 0);
    const __m512i top_mask = _mm512_set1_epi32(0x7ff00000),
                  top_limit = _mm512_set1_epi32(0x42a00000);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 v = _mm512_castsi512_ps(
            _mm512_xor_si512(_mm512_castps_si512(_mm512_loadu_ps(x + i)), flip));
        // glibc's slow path: top12(|x|) ≥ top12(88) (|x| ≥ 88, inf, NaN) to std::exp
        const __m512i top = _mm512_and_si512(_mm512_castps_si512(v), top_mask);
        if (_mm512_cmpge_epi32_mask(top, top_limit) != 0) {
            alignas(64) float tmp[16];
            _mm512_store_ps(tmp, v);
            for (int j = 0; j < 16; ++j)
                y[i + j] = std::exp(tmp[j]);
            continue;
        }
        const __m256 lo = expf8(_mm512_castps512_ps256(v));
        const __m256 hi = expf8(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
        _mm512_storeu_ps(
            y + i,
            _mm512_castpd_ps(_mm512_insertf64x4(
                _mm512_castps_pd(_mm512_castps256_ps512(lo)), _mm256_castps_pd(hi), 1)));
    }
    for (; i < n; ++i)
        y[i] = std::exp(negate ? -x[i] : x[i]);
}

// Whether libm's expf is the algorithm above: a few inputs that tell it from other expf's.
bool libm_matches() {
    if (!cpu_avx512f())
        return false;
    static const bool yes = [] {
        alignas(64) float x[16], y[16];
        for (int j = 0; j < 16; ++j)
            x[j] = -87.0f + 11.3f * static_cast<float>(j) + 0.0123f * static_cast<float>(j * j);
        expf_avx512(x, false, y, 16);
        for (int j = 0; j < 16; ++j)
            if (std::bit_cast<uint32_t>(y[j]) != std::bit_cast<uint32_t>(std::exp(x[j])))
                return false;
        return true;
    }();
    return yes;
}

}  // namespace

bool expf_vector() {
    return libm_matches();
}

void expf_array(const float* x, bool negate, float* y, int64_t n) {
    if (expf_vector())
        return expf_avx512(x, negate, y, n);
    for (int64_t i = 0; i < n; ++i)
        y[i] = std::exp(negate ? -x[i] : x[i]);
}

}  // namespace hymoe::ops::detail
