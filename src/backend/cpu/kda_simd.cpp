// The chunked KDA scan's vector kernels (backend/cpu/kda_simd.h): AVX-512 bodies through compiler
// intrinsics (target attribute, no global -mavx512f), picked once at run time by
// __builtin_cpu_supports, and scalar bodies with the same polynomial for other CPUs.
#include "kda_simd.h"

#include <algorithm>
#include <cmath>
#include <immintrin.h>

// g++ 12's unmasked AVX-512 intrinsics pass _mm512_undefined_ps() as the unused merge source,
// which -Wmaybe-uninitialized (and, at -O1 as in SAN=asan, -Wuninitialized) reports at every
// inlined use (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include "kda_simd_exp.h"

namespace hymoe::ops {

namespace {

using namespace kda_simd;

__attribute__((target("avx512f"))) void exp_array_avx512(const float* x, float* y, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? 0xffff : static_cast<__mmask16>((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(y + i, m, exp_avx512(_mm512_maskz_loadu_ps(m, x + i)));
    }
}

__attribute__((target("avx512f"))) void decay_rows_avx512(const float* a,
                                                          int64_t lda,
                                                          const float* gam,
                                                          const float* ref,
                                                          float sign,
                                                          int64_t rows,
                                                          int64_t K,
                                                          float* out) {
    const __m512 sg = _mm512_set1_ps(sign);
    for (int64_t i = 0; i < rows; ++i) {
        for (int64_t x = 0; x < K; x += 16) {
            const __mmask16 m = K - x >= 16 ? 0xffff : static_cast<__mmask16>((1u << (K - x)) - 1);
            __m512 d = _mm512_maskz_loadu_ps(m, gam + i * K + x);
            if (ref != nullptr)
                d = _mm512_sub_ps(d, _mm512_maskz_loadu_ps(m, ref + x));
            const __m512 e = exp_avx512(_mm512_mul_ps(sg, d));
            _mm512_mask_storeu_ps(
                out + i * K + x, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, a + i * lda + x), e));
        }
    }
}

__attribute__((target("avx512f"))) void diag_grads_avx512(int64_t n,
                                                          int64_t K,
                                                          const float* q,
                                                          const float* k,
                                                          int64_t ld,
                                                          const float* gam,
                                                          const float* daqk,
                                                          const float* dakk,
                                                          int64_t ldd,
                                                          float* dqa,
                                                          float* dkr,
                                                          float* dkc) {
    for (int64_t i = 1; i < n; ++i) {
        for (int64_t j = 0; j < i; ++j) {
            const __m512 a = _mm512_set1_ps(daqk[i * ldd + j]),
                         m = _mm512_set1_ps(dakk[i * ldd + j]);
            for (int64_t x = 0; x < K; x += 16) {
                const __mmask16 mk =
                    K - x >= 16 ? 0xffff : static_cast<__mmask16>((1u << (K - x)) - 1);
                const __m512 e =
                    exp_avx512(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, gam + i * K + x),
                                             _mm512_maskz_loadu_ps(mk, gam + j * K + x)));
                const __m512 kje = _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, k + j * ld + x), e);
                const __m512 qi = _mm512_maskz_loadu_ps(mk, q + i * ld + x);
                const __m512 ki = _mm512_maskz_loadu_ps(mk, k + i * ld + x);
                _mm512_mask_storeu_ps(
                    dqa + i * K + x,
                    mk,
                    _mm512_fmadd_ps(a, kje, _mm512_maskz_loadu_ps(mk, dqa + i * K + x)));
                _mm512_mask_storeu_ps(
                    dkr + i * K + x,
                    mk,
                    _mm512_fmadd_ps(m, kje, _mm512_maskz_loadu_ps(mk, dkr + i * K + x)));
                const __m512 w = _mm512_mul_ps(_mm512_fmadd_ps(a, qi, _mm512_mul_ps(m, ki)), e);
                _mm512_mask_storeu_ps(dkc + j * K + x,
                                      mk,
                                      _mm512_add_ps(w, _mm512_maskz_loadu_ps(mk, dkc + j * K + x)));
            }
        }
    }
}

// kda_token_step's columns [y0, y0 + 16·NB) of S, the last vector masked by mk: u and o stay
// in registers between the two sweeps.
template <int NB>
__attribute__((target("avx512f"))) void token_cols_avx512(int64_t K,
                                                          int64_t V,
                                                          int64_t y0,
                                                          __mmask16 mk,
                                                          const float* q,
                                                          const float* k,
                                                          const float* e,
                                                          const float* v,
                                                          float beta,
                                                          float* S,
                                                          float* o) {
    __m512 u[NB], acc[NB];
#pragma GCC unroll 8
    for (int b = 0; b < NB; ++b)
        u[b] = _mm512_setzero_ps();
    for (int64_t x = 0; x < K; ++x) {  // u = S'ᵀk, S' = e^g ⊙ S
        const __m512 ex = _mm512_set1_ps(e[x]), kx = _mm512_set1_ps(k[x]);
        const float* row = S + x * V + y0;
#pragma GCC unroll 8
        for (int b = 0; b < NB; ++b) {
            const __m512 s = _mm512_maskz_loadu_ps(b == NB - 1 ? mk : 0xffff, row + 16 * b);
            u[b] = _mm512_fmadd_ps(kx, _mm512_mul_ps(ex, s), u[b]);
        }
    }
    const __m512 bv = _mm512_set1_ps(beta);
#pragma GCC unroll 8
    for (int b = 0; b < NB; ++b) {  // u = β (v − S'ᵀk)
        const __m512 vb = _mm512_maskz_loadu_ps(b == NB - 1 ? mk : 0xffff, v + y0 + 16 * b);
        u[b] = _mm512_mul_ps(bv, _mm512_sub_ps(vb, u[b]));
        acc[b] = _mm512_setzero_ps();
    }
    for (int64_t x = 0; x < K; ++x) {  // S = S' + k uᵀ; o = Sᵀq
        const __m512 ex = _mm512_set1_ps(e[x]), kx = _mm512_set1_ps(k[x]),
                     qx = _mm512_set1_ps(q[x]);
        float* row = S + x * V + y0;
#pragma GCC unroll 8
        for (int b = 0; b < NB; ++b) {
            const __mmask16 m = b == NB - 1 ? mk : 0xffff;
            const __m512 s = _mm512_fmadd_ps(
                kx, u[b], _mm512_mul_ps(ex, _mm512_maskz_loadu_ps(m, row + 16 * b)));
            _mm512_mask_storeu_ps(row + 16 * b, m, s);
            acc[b] = _mm512_fmadd_ps(qx, s, acc[b]);
        }
    }
#pragma GCC unroll 8
    for (int b = 0; b < NB; ++b)
        _mm512_mask_storeu_ps(o + y0 + 16 * b, b == NB - 1 ? mk : 0xffff, acc[b]);
}

using TokenColsFn = void (*)(int64_t,
                             int64_t,
                             int64_t,
                             __mmask16,
                             const float*,
                             const float*,
                             const float*,
                             const float*,
                             float,
                             float*,
                             float*);
// token_cols_avx512 by the number of 16-column vectors in a block (1 .. 8)
constexpr TokenColsFn kTokenCols[9] = {nullptr,
                                       token_cols_avx512<1>,
                                       token_cols_avx512<2>,
                                       token_cols_avx512<3>,
                                       token_cols_avx512<4>,
                                       token_cols_avx512<5>,
                                       token_cols_avx512<6>,
                                       token_cols_avx512<7>,
                                       token_cols_avx512<8>};

__attribute__((target("avx512f"))) void token_step_avx512(int64_t K,
                                                          int64_t V,
                                                          const float* q,
                                                          const float* k,
                                                          const float* v,
                                                          const float* g,
                                                          float beta,
                                                          float* S,
                                                          float* o,
                                                          float* e) {
    exp_array_avx512(g, e, K);
    for (int64_t y0 = 0; y0 < V; y0 += 128) {
        const int64_t w = std::min<int64_t>(128, V - y0), nb = (w + 15) / 16,
                      tail = w - 16 * (nb - 1);
        const auto mk = static_cast<__mmask16>(tail == 16 ? 0xffff : (1u << tail) - 1);
        kTokenCols[nb](K, V, y0, mk, q, k, e, v, beta, S, o);
    }
}

}  // namespace

void kda_exp(const float* x, float* y, int64_t n) {
    if (have_avx512()) {
        exp_array_avx512(x, y, n);
        return;
    }
    for (int64_t i = 0; i < n; ++i)
        y[i] = exp_scalar(x[i]);
}

void kda_decay_rows(const float* a,
                    int64_t lda,
                    const float* gam,
                    const float* ref,
                    float sign,
                    int64_t rows,
                    int64_t K,
                    float* out) {
    if (have_avx512()) {
        decay_rows_avx512(a, lda, gam, ref, sign, rows, K, out);
        return;
    }
    for (int64_t i = 0; i < rows; ++i)
        for (int64_t x = 0; x < K; ++x)
            out[i * K + x] =
                a[i * lda + x] * exp_scalar(sign * (gam[i * K + x] - (ref ? ref[x] : 0.0f)));
}

void kda_diag_grads(int64_t n,
                    int64_t K,
                    const float* q,
                    const float* k,
                    int64_t ld,
                    const float* gam,
                    const float* daqk,
                    const float* dakk,
                    int64_t ldd,
                    float* dqa,
                    float* dkr,
                    float* dkc) {
    if (have_avx512()) {
        diag_grads_avx512(n, K, q, k, ld, gam, daqk, dakk, ldd, dqa, dkr, dkc);
        return;
    }
    for (int64_t i = 1; i < n; ++i) {
        for (int64_t j = 0; j < i; ++j) {
            const float a = daqk[i * ldd + j], m = dakk[i * ldd + j];
            for (int64_t x = 0; x < K; ++x) {
                const float e = exp_scalar(gam[i * K + x] - gam[j * K + x]);
                const float kje = k[j * ld + x] * e;
                dqa[i * K + x] += a * kje;
                dkr[i * K + x] += m * kje;
                dkc[j * K + x] += (a * q[i * ld + x] + m * k[i * ld + x]) * e;
            }
        }
    }
}

void kda_token_step(int64_t K,
                    int64_t V,
                    const float* q,
                    const float* k,
                    const float* v,
                    const float* g,
                    float beta,
                    float* S,
                    float* o,
                    float* work) {
    if (have_avx512()) {
        token_step_avx512(K, V, q, k, v, g, beta, S, o, work);
        return;
    }
    kda_token_step_portable(K, V, q, k, v, g, beta, S, o, work);
}

void kda_token_step_portable(int64_t K,
                             int64_t V,
                             const float* q,
                             const float* k,
                             const float* v,
                             const float* g,
                             float beta,
                             float* S,
                             float* o,
                             float* work) {
    float* e = work;      // [K] e^g
    float* u = work + K;  // [V] β (v − S'ᵀk)
    for (int64_t x = 0; x < K; ++x)
        e[x] = exp_scalar(g[x]);
    std::fill(u, u + V, 0.0f);
    for (int64_t x = 0; x < K; ++x)
        for (int64_t y = 0; y < V; ++y)
            u[y] += k[x] * (e[x] * S[x * V + y]);
    for (int64_t y = 0; y < V; ++y)
        u[y] = beta * (v[y] - u[y]);
    std::fill(o, o + V, 0.0f);
    for (int64_t x = 0; x < K; ++x)
        for (int64_t y = 0; y < V; ++y) {
            const float s = e[x] * S[x * V + y] + k[x] * u[y];
            S[x * V + y] = s;
            o[y] += q[x] * s;
        }
}

}  // namespace hymoe::ops
