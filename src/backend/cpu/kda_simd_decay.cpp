// The chunked KDA forward's decay kernels (backend/cpu/kda_simd.h): e^g of every token, and every
// decay factor of a chunk as a running product of those e^g (kda_decay_forward,
// kda_decay_backward, the pairwise factors of kda_diag_scores), the products that the recurrence
// itself applies to its state one token at a time. AVX-512 bodies through compiler intrinsics
// (target attribute), picked once at run time, and scalar bodies with the same order of products.
#include <algorithm>
#include <immintrin.h>
#include <vector>

#include "kda_simd.h"

// g++ 12's unmasked AVX-512 intrinsics pass _mm512_undefined_ps() as the unused merge source,
// which -Wmaybe-uninitialized (and, at -O1 as in SAN=asan, -Wuninitialized) reports at every
// inlined use (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include "avx512_transpose.h"
#include "kda_simd_exp.h"

namespace hymoe::ops {

namespace {

using namespace kda_simd;

// The kernels below walk the rows in order with the columns [x0, x0 + 16·NB) of a row in NB
// registers (the last vector masked by mk), so that the NB running sums or products are
// independent chains; tables by NB pick the body for a block of up to 128 columns.
#define HYMOE_KDA_TABLE(name) \
    { nullptr, name<1>, name<2>, name<3>, name<4>, name<5>, name<6>, name<7>, name<8> }

template <int NB>
__attribute__((target("avx512f"))) void gates_cols(const float* g,
                                                   int64_t ldg,
                                                   int64_t rows,
                                                   int64_t K,
                                                   int64_t x0,
                                                   __mmask16 mk,
                                                   float* eg,
                                                   float* gam) {
    __m512 sum[NB];
#pragma GCC unroll 8
    for (int b = 0; b < NB; ++b)
        sum[b] = _mm512_setzero_ps();
    for (int64_t i = 0; i < rows; ++i) {
#pragma GCC unroll 8
        for (int b = 0; b < NB; ++b) {
            const __mmask16 m = b == NB - 1 ? mk : 0xffff;
            const int64_t x = x0 + 16 * b;
            const __m512 gi = _mm512_maskz_loadu_ps(m, g + i * ldg + x);
            sum[b] = _mm512_add_ps(sum[b], gi);
            _mm512_mask_storeu_ps(gam + i * K + x, m, sum[b]);
            _mm512_mask_storeu_ps(eg + i * K + x, m, exp_avx512(gi));
        }
    }
}

template <int NB>
__attribute__((target("avx512f"))) void forward_cols(const float* a,
                                                     const float* b,
                                                     int64_t lda,
                                                     const float* eg,
                                                     bool first,
                                                     int64_t rows,
                                                     int64_t K,
                                                     int64_t x0,
                                                     __mmask16 mk,
                                                     float* a_out,
                                                     float* b_out,
                                                     float* last) {
    __m512 p[NB];
#pragma GCC unroll 8
    for (int v = 0; v < NB; ++v)
        p[v] = first ? _mm512_maskz_loadu_ps(v == NB - 1 ? mk : 0xffff, eg + x0 + 16 * v)
                     : _mm512_set1_ps(1.0f);
    for (int64_t i = 0; i < rows; ++i) {
#pragma GCC unroll 8
        for (int v = 0; v < NB; ++v) {
            const __mmask16 m = v == NB - 1 ? mk : 0xffff;
            const int64_t x = x0 + 16 * v;
            if (i > 0)
                p[v] = _mm512_mul_ps(p[v], _mm512_maskz_loadu_ps(m, eg + i * K + x));
            _mm512_mask_storeu_ps(a_out + i * K + x,
                                  m,
                                  _mm512_mul_ps(_mm512_maskz_loadu_ps(m, a + i * lda + x), p[v]));
            if (b != nullptr)
                _mm512_mask_storeu_ps(
                    b_out + i * K + x,
                    m,
                    _mm512_mul_ps(_mm512_maskz_loadu_ps(m, b + i * lda + x), p[v]));
        }
    }
    if (last != nullptr)
#pragma GCC unroll 8
        for (int v = 0; v < NB; ++v)
            _mm512_mask_storeu_ps(last + x0 + 16 * v, v == NB - 1 ? mk : 0xffff, p[v]);
}

template <int NB>
__attribute__((target("avx512f"))) void backward_cols(const float* a,
                                                      int64_t lda,
                                                      const float* eg,
                                                      bool tail,
                                                      int64_t rows,
                                                      int64_t K,
                                                      int64_t x0,
                                                      __mmask16 mk,
                                                      float* out) {
    __m512 p[NB];
#pragma GCC unroll 8
    for (int v = 0; v < NB; ++v)
        p[v] = tail ? _mm512_maskz_loadu_ps(v == NB - 1 ? mk : 0xffff, eg + rows * K + x0 + 16 * v)
                    : _mm512_set1_ps(1.0f);
    for (int64_t i = rows - 1; i >= 0; --i) {
#pragma GCC unroll 8
        for (int v = 0; v < NB; ++v) {
            const __mmask16 m = v == NB - 1 ? mk : 0xffff;
            const int64_t x = x0 + 16 * v;
            _mm512_mask_storeu_ps(
                out + i * K + x, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, a + i * lda + x), p[v]));
            p[v] = _mm512_mul_ps(p[v], _mm512_maskz_loadu_ps(m, eg + i * K + x));
        }
    }
}

// kda_decay_backward_t's columns [x0, x0 + 16) (mask mk): rows by blocks of 16 from the last,
// each block's 16 row vectors turned by one register transpose into 16 rows of out_t.
__attribute__((target("avx512f"))) void backward_t_cols(const float* a,
                                                        int64_t lda,
                                                        const float* eg,
                                                        int64_t rows,
                                                        int64_t K,
                                                        int64_t x0,
                                                        __mmask16 mk,
                                                        float* out_t,
                                                        int64_t ldo) {
    __m512 p = _mm512_set1_ps(1.0f), r[16];
    for (int64_t hi = rows; hi > 0; hi -= 16) {
        const int64_t lo = std::max<int64_t>(0, hi - 16);
        for (int64_t l = 15; l >= 0; --l) {
            const int64_t i = lo + l;
            if (i >= hi) {
                r[l] = _mm512_setzero_ps();
                continue;
            }
            r[l] = _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, a + i * lda + x0), p);
            p = _mm512_mul_ps(p, _mm512_maskz_loadu_ps(mk, eg + i * K + x0));
        }
        detail::transpose16(r);
        const __mmask16 mr = lanes(hi - lo);
        for (int64_t x = 0; x < std::min<int64_t>(16, K - x0); ++x)
            _mm512_mask_storeu_ps(out_t + (x0 + x) * ldo + lo, mr, r[x]);
    }
}

using GatesFn =
    void (*)(const float*, int64_t, int64_t, int64_t, int64_t, __mmask16, float*, float*);
using ForwardFn = void (*)(const float*,
                           const float*,
                           int64_t,
                           const float*,
                           bool,
                           int64_t,
                           int64_t,
                           int64_t,
                           __mmask16,
                           float*,
                           float*,
                           float*);
using BackwardFn = void (*)(
    const float*, int64_t, const float*, bool, int64_t, int64_t, int64_t, __mmask16, float*);
constexpr GatesFn kGates[9] = HYMOE_KDA_TABLE(gates_cols);
constexpr ForwardFn kForward[9] = HYMOE_KDA_TABLE(forward_cols);
constexpr BackwardFn kBackward[9] = HYMOE_KDA_TABLE(backward_cols);

// Calls body(x0, nb, mask) for the blocks of up to 128 columns of K.
template <class Body>
void by_blocks(int64_t K, Body body) {
    for (int64_t x0 = 0; x0 < K; x0 += 128) {
        const int64_t w = std::min<int64_t>(128, K - x0), nb = (w + 15) / 16;
        body(x0, nb, lanes(w - 16 * (nb - 1)));
    }
}

// Row i of a diagonal block over the columns [x0, x0 + 16·NB) (the last vector masked by mk):
// pq[j], pk[j] += the lanes of Σ_x q_ix k_jx f_ijx and Σ_x k_ix k_jx f_ijx for j ≤ i, with the
// factor f_ij = Π_{l=j+1..i} e^{g_l} built up from j = i (f = 1) down to 0.
template <int NB>
__attribute__((target("avx512f"))) void diag_row_avx512(int64_t i,
                                                        int64_t K,
                                                        int64_t x0,
                                                        __mmask16 mk,
                                                        const float* q,
                                                        const float* k,
                                                        int64_t ld,
                                                        const float* eg,
                                                        __m512* pq,
                                                        __m512* pk) {
    __m512 qi[NB], ki[NB], f[NB];
#pragma GCC unroll 8
    for (int b = 0; b < NB; ++b) {
        const __mmask16 m = b == NB - 1 ? mk : 0xffff;
        qi[b] = _mm512_maskz_loadu_ps(m, q + i * ld + x0 + 16 * b);
        ki[b] = _mm512_maskz_loadu_ps(m, k + i * ld + x0 + 16 * b);
        f[b] = _mm512_set1_ps(1.0f);
    }
    for (int64_t j = i; j >= 0; --j) {
        __m512 aq = _mm512_setzero_ps(), ak = _mm512_setzero_ps();
#pragma GCC unroll 8
        for (int b = 0; b < NB; ++b) {
            const __mmask16 m = b == NB - 1 ? mk : 0xffff;
            const __m512 kje =
                _mm512_mul_ps(_mm512_maskz_loadu_ps(m, k + j * ld + x0 + 16 * b), f[b]);
            aq = _mm512_fmadd_ps(qi[b], kje, aq);
            ak = _mm512_fmadd_ps(ki[b], kje, ak);
            f[b] = _mm512_mul_ps(f[b], _mm512_maskz_loadu_ps(m, eg + j * K + x0 + 16 * b));
        }
        pq[j] = _mm512_add_ps(pq[j], aq);
        pk[j] = _mm512_add_ps(pk[j], ak);
    }
}

using DiagRowFn = void (*)(int64_t,
                           int64_t,
                           int64_t,
                           __mmask16,
                           const float*,
                           const float*,
                           int64_t,
                           const float*,
                           __m512*,
                           __m512*);
constexpr DiagRowFn kDiagRow[9] = HYMOE_KDA_TABLE(diag_row_avx512);

__attribute__((target("avx512f"))) void diag_scores_avx512(int64_t n,
                                                           int64_t K,
                                                           const float* q,
                                                           const float* k,
                                                           int64_t ld,
                                                           const float* eg,
                                                           float* aqk,
                                                           float* akk,
                                                           int64_t ldo) {
    __m512 pq[16], pk[16];
    for (int64_t i = 0; i < n; ++i) {
        for (int64_t j = 0; j <= i; ++j)
            pq[j] = pk[j] = _mm512_setzero_ps();
        by_blocks(K, [&](int64_t x0, int64_t nb, __mmask16 mk) {
            kDiagRow[nb](i, K, x0, mk, q, k, ld, eg, pq, pk);
        });
        for (int64_t j = 0; j <= i; ++j) {
            aqk[i * ldo + j] = _mm512_reduce_add_ps(pq[j]);
            akk[i * ldo + j] = _mm512_reduce_add_ps(pk[j]);
        }
    }
}

__attribute__((target("avx512f"))) void scale_avx512(float* a,
                                                     int64_t lda,
                                                     const float* row_s,
                                                     int64_t ss,
                                                     const float* col_s,
                                                     int64_t rows,
                                                     int64_t cols) {
    for (int64_t i = 0; i < rows; ++i) {
        const __m512 r = _mm512_set1_ps(row_s != nullptr ? row_s[i * ss] : 1.0f);
        for (int64_t j = 0; j < cols; j += 16) {
            const __mmask16 m = lanes(cols - j);
            __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, a + i * lda + j), r);
            if (col_s != nullptr)
                v = _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, col_s + j));
            _mm512_mask_storeu_ps(a + i * lda + j, m, v);
        }
    }
}

__attribute__((target("avx512f"))) void sub_from_avx512(
    const float* a, int64_t lda, float* x, int64_t ldx, int64_t rows, int64_t cols) {
    for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; j += 16) {
            const __mmask16 m = lanes(cols - j);
            _mm512_mask_storeu_ps(x + i * ldx + j,
                                  m,
                                  _mm512_sub_ps(_mm512_maskz_loadu_ps(m, a + i * lda + j),
                                                _mm512_maskz_loadu_ps(m, x + i * ldx + j)));
        }
}

}  // namespace

void kda_gates(const float* g, int64_t ldg, int64_t rows, int64_t K, float* eg, float* gam) {
    if (have_avx512()) {
        by_blocks(K, [&](int64_t x0, int64_t nb, __mmask16 mk) {
            kGates[nb](g, ldg, rows, K, x0, mk, eg, gam);
        });
        return;
    }
    for (int64_t i = 0; i < rows; ++i)
        for (int64_t x = 0; x < K; ++x) {
            gam[i * K + x] = (i ? gam[(i - 1) * K + x] : 0.0f) + g[i * ldg + x];
            eg[i * K + x] = exp_scalar(g[i * ldg + x]);
        }
}

void kda_decay_forward(const float* a,
                       const float* b,
                       int64_t lda,
                       const float* eg,
                       bool first,
                       int64_t rows,
                       int64_t K,
                       float* a_out,
                       float* b_out,
                       float* last) {
    if (have_avx512()) {
        by_blocks(K, [&](int64_t x0, int64_t nb, __mmask16 mk) {
            kForward[nb](a, b, lda, eg, first, rows, K, x0, mk, a_out, b_out, last);
        });
        return;
    }
    for (int64_t x = 0; x < K; ++x) {
        float p = first ? eg[x] : 1.0f;
        for (int64_t i = 0; i < rows; ++i) {
            if (i > 0)
                p *= eg[i * K + x];
            a_out[i * K + x] = a[i * lda + x] * p;
            if (b != nullptr)
                b_out[i * K + x] = b[i * lda + x] * p;
        }
        if (last != nullptr)
            last[x] = p;
    }
}

void kda_decay_backward(
    const float* a, int64_t lda, const float* eg, bool tail, int64_t rows, int64_t K, float* out) {
    if (have_avx512()) {
        by_blocks(K, [&](int64_t x0, int64_t nb, __mmask16 mk) {
            kBackward[nb](a, lda, eg, tail, rows, K, x0, mk, out);
        });
        return;
    }
    for (int64_t x = 0; x < K; ++x) {
        float p = tail ? eg[rows * K + x] : 1.0f;
        for (int64_t i = rows - 1; i >= 0; --i) {
            out[i * K + x] = a[i * lda + x] * p;
            p *= eg[i * K + x];
        }
    }
}

void kda_decay_backward_t(const float* a,
                          int64_t lda,
                          const float* eg,
                          int64_t rows,
                          int64_t K,
                          float* out_t,
                          int64_t ldo) {
    if (have_avx512()) {
        for (int64_t x0 = 0; x0 < K; x0 += 16)
            backward_t_cols(a, lda, eg, rows, K, x0, lanes(K - x0), out_t, ldo);
        return;
    }
    for (int64_t x = 0; x < K; ++x) {
        float p = 1.0f;
        for (int64_t i = rows - 1; i >= 0; --i) {
            out_t[x * ldo + i] = a[i * lda + x] * p;
            p *= eg[i * K + x];
        }
    }
}

void kda_diag_scores(int64_t n,
                     int64_t K,
                     const float* q,
                     const float* k,
                     int64_t ld,
                     const float* eg,
                     float* aqk,
                     float* akk,
                     int64_t ldo) {
    if (have_avx512()) {
        diag_scores_avx512(n, K, q, k, ld, eg, aqk, akk, ldo);
        return;
    }
    std::vector<float> f(static_cast<size_t>(K));
    for (int64_t i = 0; i < n; ++i) {
        std::fill(f.begin(), f.end(), 1.0f);
        for (int64_t j = i; j >= 0; --j) {
            float acc_q = 0.0f, acc_k = 0.0f;
            for (int64_t x = 0; x < K; ++x) {
                const float kje = k[j * ld + x] * f[static_cast<size_t>(x)];
                acc_q += q[i * ld + x] * kje;
                acc_k += k[i * ld + x] * kje;
                f[static_cast<size_t>(x)] *= eg[j * K + x];
            }
            aqk[i * ldo + j] = acc_q;
            akk[i * ldo + j] = acc_k;
        }
    }
}

void kda_scale(float* a,
               int64_t lda,
               const float* row_s,
               int64_t ss,
               const float* col_s,
               int64_t rows,
               int64_t cols) {
    if (have_avx512()) {
        scale_avx512(a, lda, row_s, ss, col_s, rows, cols);
        return;
    }
    for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j)
            a[i * lda + j] = a[i * lda + j] * (row_s != nullptr ? row_s[i * ss] : 1.0f) *
                             (col_s != nullptr ? col_s[j] : 1.0f);
}

void kda_sub_from(const float* a, int64_t lda, float* x, int64_t ldx, int64_t rows, int64_t cols) {
    if (have_avx512()) {
        sub_from_avx512(a, lda, x, ldx, rows, cols);
        return;
    }
    for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j)
            x[i * ldx + j] = a[i * lda + j] - x[i * ldx + j];
}

}  // namespace hymoe::ops
