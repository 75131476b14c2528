// AVX-512 GEMV kernels for products with a few activation rows (decode;
// backend/cpu/weight_kernels.h): fp32 and bf16 weights [n, k], each weight row streamed once,
// whole, in memory order: one linear stream, which the hardware prefetcher keeps at the DRAM read
// rate (measured here: at or above memchr's rate, where interleaving 2-4 rows' streams reached
// 0.5-0.9 of it). With one activation row a software prefetch only slows the stream (16 KiB ahead:
// by ~15%); with 2-4, whose FMAs per weight line pace the loop, one 4 KiB ahead gains ~20% (they
// still read ~0.6 of the rate of one row, on this Zen 5 host: measured, not understood). Every
// output element is one dot product summed in a fixed order (four lane-parallel partial sums, added
// pairwise, then the lanes), whatever m, n or the thread split: a row's result depends on neither
// the batch nor the threads. Threads (OpenMP, when built with it) take contiguous blocks of weight
// rows. And the few rows against a bf16 W [k, n] (bf16_gemv_n_avx512), on one thread. This file is
// compiled with -mavx512f -mavx512bw -mavx512vl -mavx512bf16 (and -fopenmp); weight_gemm.cpp calls
// it only after the cpuid checks. g++ 12's AVX-512 headers start vectors as `__Y = __Y` (undefined
// on purpose), which -Wuninitialized reports at every inlined use: silenced for this file only.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <algorithm>
#include <immintrin.h>
#include <vector>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "weight_kernels.h"

namespace hymoe::ops::detail {

bool cpu_has_avx512() {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl");
}

void round_to_bf16(const float* src, int64_t n, uint16_t* dst) {
    const __m512i lsb = _mm512_set1_epi32(1), bias = _mm512_set1_epi32(0x7fff),
                  abs = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000),
                  quiet = _mm512_set1_epi32(0x40);
    for (int64_t p = 0; p < n; p += 16) {
        const __mmask16 mk = n - p >= 16 ? static_cast<__mmask16>(0xffff)
                                         : static_cast<__mmask16>((1u << (n - p)) - 1);
        const __m512i u = _mm512_castps_si512(_mm512_maskz_loadu_ps(mk, src + p));
        // float_to_bf16: u + 0x7fff + (bit 16 of u), top half; a NaN keeps its top half, quiet
        const __m512i up = _mm512_add_epi32(
            u, _mm512_add_epi32(bias, _mm512_and_si512(_mm512_srli_epi32(u, 16), lsb)));
        const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, abs), inf);
        const __m512i h =
            _mm512_mask_or_epi32(_mm512_srli_epi32(up, 16), nan, _mm512_srli_epi32(u, 16), quiet);
        _mm256_mask_storeu_epi16(dst + p, mk, _mm512_cvtepi32_epi16(h));
    }
}

namespace {

constexpr int64_t kAheadBytes = 4096;  // software prefetch distance with M ≥ 2 activation rows
constexpr int64_t kRowBlock = 16;      // thread blocks start at multiples of 16 weight rows
// below this many weight bytes a product runs on one thread (a fork costs a few µs)
constexpr int64_t kMinParallelBytes = int64_t{1} << 19;

// The line kAheadBytes ahead of p on the weight stream, when M ≥ 2 (see the header).
template <int M>
inline void prefetch_ahead(const void* p) {
    if constexpr (M >= 2)
        _mm_prefetch(static_cast<const char*>(p) + kAheadBytes, _MM_HINT_T0);
}

inline float finish(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

inline void store(float alpha, float sum, float beta, float* c) {
    *c = beta == 0.0f ? alpha * sum : alpha * sum + beta * *c;
}

// Weight rows [j0, j1): c [M, j] (+)= x [M, k] · w [j, k], x fp32 (row stride ldx).
template <int M>
void f32_rows(int64_t j0,
              int64_t j1,
              int64_t k,
              float alpha,
              const float* x,
              int64_t ldx,
              const float* w,
              int64_t ldw,
              float beta,
              float* c,
              int64_t ldc) {
    for (int64_t j = j0; j < j1; ++j) {
        const float* wr = w + j * ldw;
        __m512 acc[M][4];
#pragma GCC unroll 4
        for (int i = 0; i < M; ++i)
#pragma GCC unroll 4
            for (int u = 0; u < 4; ++u)
                acc[i][u] = _mm512_setzero_ps();
        int64_t p = 0;
        for (; p + 64 <= k; p += 64) {  // four 64-byte lines of the row
#pragma GCC unroll 4
            for (int u = 0; u < 4; ++u) {
                prefetch_ahead<M>(wr + p + 16 * u);
                const __m512 wv = _mm512_loadu_ps(wr + p + 16 * u);
#pragma GCC unroll 4
                for (int i = 0; i < M; ++i)
                    acc[i][u] =
                        _mm512_fmadd_ps(_mm512_loadu_ps(x + i * ldx + p + 16 * u), wv, acc[i][u]);
            }
        }
        for (; p < k; p += 16) {  // the tail: 16 at a time, the last masked
            const __mmask16 mk = k - p >= 16 ? static_cast<__mmask16>(0xffff)
                                             : static_cast<__mmask16>((1u << (k - p)) - 1);
            const __m512 wv = _mm512_maskz_loadu_ps(mk, wr + p);
#pragma GCC unroll 4
            for (int i = 0; i < M; ++i)
                acc[i][0] =
                    _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, x + i * ldx + p), wv, acc[i][0]);
        }
#pragma GCC unroll 4
        for (int i = 0; i < M; ++i)
            store(alpha, finish(acc[i][0], acc[i][1], acc[i][2], acc[i][3]), beta, c + i * ldc + j);
    }
}

// Weight rows [j0, j1): c [M, j] (+)= x16 [M, k] · w [j, k], x16 bf16 (row stride ldx).
template <int M>
void bf16_rows(int64_t j0,
               int64_t j1,
               int64_t k,
               float alpha,
               const uint16_t* x16,
               int64_t ldx,
               const uint16_t* w,
               int64_t ldw,
               float beta,
               float* c,
               int64_t ldc) {
    for (int64_t j = j0; j < j1; ++j) {
        const uint16_t* wr = w + j * ldw;
        __m512 acc[M][4];
#pragma GCC unroll 4
        for (int i = 0; i < M; ++i)
#pragma GCC unroll 4
            for (int u = 0; u < 4; ++u)
                acc[i][u] = _mm512_setzero_ps();
        int64_t p = 0;
        for (; p + 128 <= k; p += 128) {  // four 64-byte lines of the row
#pragma GCC unroll 4
            for (int u = 0; u < 4; ++u) {
                prefetch_ahead<M>(wr + p + 32 * u);
                const auto wv = reinterpret_cast<__m512bh>(_mm512_loadu_si512(wr + p + 32 * u));
#pragma GCC unroll 4
                for (int i = 0; i < M; ++i)
                    acc[i][u] = _mm512_dpbf16_ps(
                        acc[i][u],
                        reinterpret_cast<__m512bh>(_mm512_loadu_si512(x16 + i * ldx + p + 32 * u)),
                        wv);
            }
        }
        for (; p < k; p += 32) {  // the tail: 32 at a time, the last masked
            const __mmask32 mk = k - p >= 32 ? ~0u : (1u << (k - p)) - 1;
            const auto wv = reinterpret_cast<__m512bh>(_mm512_maskz_loadu_epi16(mk, wr + p));
#pragma GCC unroll 4
            for (int i = 0; i < M; ++i)
                acc[i][0] = _mm512_dpbf16_ps(
                    acc[i][0],
                    reinterpret_cast<__m512bh>(_mm512_maskz_loadu_epi16(mk, x16 + i * ldx + p)),
                    wv);
        }
#pragma GCC unroll 4
        for (int i = 0; i < M; ++i)
            store(alpha, finish(acc[i][0], acc[i][1], acc[i][2], acc[i][3]), beta, c + i * ldc + j);
    }
}

// c [M, n] (+)= a [M, k] · w [k, n], w bf16 (row stride ldw) widened exactly in registers, a
// fp32: 64 columns at a time, one FMA chain per output element over p in order.
template <int M>
void bf16_cols(int64_t n,
               int64_t k,
               float alpha,
               const float* a,
               int64_t lda,
               const uint16_t* w,
               int64_t ldw,
               float beta,
               float* c,
               int64_t ldc) {
    const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
    for (int64_t j = 0; j < n; j += 64) {
        __mmask16 mk[4];
#pragma GCC unroll 4
        for (int u = 0; u < 4; ++u) {
            const int64_t left = std::clamp<int64_t>(n - j - 16 * u, 0, 16);
            mk[u] = static_cast<__mmask16>((1u << left) - 1);
        }
        __m512 acc[M][4];
#pragma GCC unroll 4
        for (int i = 0; i < M; ++i)
#pragma GCC unroll 4
            for (int u = 0; u < 4; ++u)
                acc[i][u] = _mm512_setzero_ps();
        for (int64_t p = 0; p < k; ++p) {
            __m512 wv[4];
#pragma GCC unroll 4
            for (int u = 0; u < 4; ++u)  // bf16 → fp32: the 16 bits on top, exact
                wv[u] = _mm512_castsi512_ps(
                    _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(
                                          mk[u], w + p * ldw + j + 16 * u)),
                                      16));
#pragma GCC unroll 4
            for (int i = 0; i < M; ++i) {
                const __m512 ai = _mm512_set1_ps(a[i * lda + p]);
#pragma GCC unroll 4
                for (int u = 0; u < 4; ++u)
                    acc[i][u] = _mm512_fmadd_ps(ai, wv[u], acc[i][u]);
            }
        }
#pragma GCC unroll 4
        for (int i = 0; i < M; ++i)
#pragma GCC unroll 4
            for (int u = 0; u < 4; ++u) {
                float* ci = c + i * ldc + j + 16 * u;
                __m512 r = _mm512_mul_ps(va, acc[i][u]);
                if (beta != 0.0f)
                    r = _mm512_add_ps(r, _mm512_mul_ps(vb, _mm512_maskz_loadu_ps(mk[u], ci)));
                _mm512_mask_storeu_ps(ci, mk[u], r);
            }
    }
}

// body(j0, j1) over [0, n): one contiguous block per thread (edges at multiples of kRowBlock)
// when the product reads at least kMinParallelBytes and OpenMP gives more than one thread, else
// one call on the whole range.
template <typename Body>
void split_rows(int64_t n, int64_t bytes, const Body& body) {
#ifdef _OPENMP
    const int64_t blocks = (n + kRowBlock - 1) / kRowBlock;
    const int64_t threads = bytes < kMinParallelBytes || omp_in_parallel()
                                ? 1
                                : std::min<int64_t>(omp_get_max_threads(), blocks);
    if (threads > 1) {
#pragma omp parallel num_threads(static_cast <int>(threads))
        {
            const int64_t t = omp_get_thread_num();
            const int64_t b0 = blocks * t / threads, b1 = blocks * (t + 1) / threads;
            body(b0 * kRowBlock, std::min(n, b1 * kRowBlock));
        }
        return;
    }
#else
    (void)bytes;
#endif
    body(0, n);
}

// Groups of up to four activation rows; kernel<M>(j0, j1, i) computes rows i..i+M of C.
template <typename Kernel>
void by_row_groups(int64_t m, int64_t n, int64_t bytes, const Kernel& kernel) {
    split_rows(n, bytes, [&](int64_t j0, int64_t j1) {
        for (int64_t i = 0; i < m; i += 4)
            switch (std::min<int64_t>(4, m - i)) {
                case 1:
                    kernel.template operator()<1>(j0, j1, i);
                    break;
                case 2:
                    kernel.template operator()<2>(j0, j1, i);
                    break;
                case 3:
                    kernel.template operator()<3>(j0, j1, i);
                    break;
                default:
                    kernel.template operator()<4>(j0, j1, i);
            }
    });
}

}  // namespace

void f32_gemv_avx512(int64_t m,
                     int64_t n,
                     int64_t k,
                     float alpha,
                     const float* a,
                     int64_t lda,
                     const float* w,
                     int64_t ldw,
                     float beta,
                     float* c,
                     int64_t ldc) {
    by_row_groups(m, n, n * k * 4, [&]<int M>(int64_t j0, int64_t j1, int64_t i) {
        f32_rows<M>(j0, j1, k, alpha, a + i * lda, lda, w, ldw, beta, c + i * ldc, ldc);
    });
}

void bf16_gemv_avx512(int64_t m,
                      int64_t n,
                      int64_t k,
                      float alpha,
                      const float* a,
                      int64_t lda,
                      const uint16_t* w,
                      int64_t ldw,
                      float beta,
                      float* c,
                      int64_t ldc) {
    thread_local std::vector<uint16_t> x16;  // [m, k] a rounded to bf16 (kept between calls)
    x16.resize(static_cast<size_t>(m * k));
    for (int64_t i = 0; i < m; ++i)
        round_to_bf16(a + i * lda, k, x16.data() + i * k);
    const uint16_t* x = x16.data();
    by_row_groups(m, n, n * k * 2, [&]<int M>(int64_t j0, int64_t j1, int64_t i) {
        bf16_rows<M>(j0, j1, k, alpha, x + i * k, k, w, ldw, beta, c + i * ldc, ldc);
    });
}

void bf16_gemv_n_avx512(int64_t m,
                        int64_t n,
                        int64_t k,
                        float alpha,
                        const float* a,
                        int64_t lda,
                        const uint16_t* w,
                        int64_t ldw,
                        float beta,
                        float* c,
                        int64_t ldc) {
    for (int64_t i = 0; i < m; i += 4)
        switch (std::min<int64_t>(4, m - i)) {
            case 1:
                bf16_cols<1>(n, k, alpha, a + i * lda, lda, w, ldw, beta, c + i * ldc, ldc);
                break;
            case 2:
                bf16_cols<2>(n, k, alpha, a + i * lda, lda, w, ldw, beta, c + i * ldc, ldc);
                break;
            case 3:
                bf16_cols<3>(n, k, alpha, a + i * lda, lda, w, ldw, beta, c + i * ldc, ldc);
                break;
            default:
                bf16_cols<4>(n, k, alpha, a + i * lda, lda, w, ldw, beta, c + i * ldc, ldc);
        }
}

}  // namespace hymoe::ops::detail
