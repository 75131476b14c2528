// The kernels behind ops::gemm_w (backend/cpu/weight_gemm.cpp dispatches): the few-row GEMVs
// (fp32 and bf16 weights) of gemv_avx512.cpp and the bf16 GEMM of linear_bf16.cpp, compiled for
// AVX-512 (+BF16) and called only after a run-time cpuid check. All compute C [m, n] = alpha ·
// A [m, k] · Wᵀ + beta · C for a W [n, k] (row stride ldw) and fp32 A, C; beta = 0 does not read
// C. Threads (OpenMP) split the weight rows (GEMV) or the 64-column panels (GEMM), never k, so
// results do not depend on the thread count.
#pragma once

#include <cstdint>

namespace hymoe::ops::detail {

// True when this CPU (and OS) runs AVX-512F/BW/VL instructions.
bool cpu_has_avx512();
// True when it also runs AVX512_BF16 (VDPBF16PS).
bool cpu_has_avx512_bf16();
// dst [n] = float_to_bf16(src [n]) (core/types.h) bit for bit, 16 at a time (AVX-512F/BW).
void round_to_bf16(const float* src, int64_t n, uint16_t* dst);
// ops::set_batch_invariant's setting (ops.cpp).
bool batch_invariant_on();

// A few rows (decode), any m but meant for m ≤ 4: each weight row streamed once in memory order
// (one linear stream for the hardware prefetcher, helped by a software prefetch for m ≥ 2) and
// dotted with up to four activation rows at a time, fp32
// accumulation in a fixed order, so a row's result does not depend on m, n or the threads.
// fp32 weights by FMA; bf16 weights by VDPBF16PS on A rounded to bf16 once, as the GEMM rounds
// it (the two bf16 kernels differ by fp32 rounding only).
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
                     int64_t ldc);
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
                      int64_t ldc);

// The same few rows against a bf16 W [k, n] (C = A · W, the absorbed MLA decode's q̂ = q_n ·
// W_kvb): W widened exactly in registers, A kept fp32, one fp32 FMA chain per output element over
// k in order, so a row's result does not depend on m; one thread (these weights are small).
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
                        int64_t ldc);

// Many rows (prefill): A rounded to bf16 once, W packed in panels of 64 columns, a 6 × 64
// register tile of VDPBF16PS products with fp32 accumulators. A row's result does not depend on
// m (nor on the other rows).
void bf16_gemm_avx512(int64_t m,
                      int64_t n,
                      int64_t k,
                      float alpha,
                      const float* a,
                      int64_t lda,
                      const uint16_t* w,
                      int64_t ldw,
                      float beta,
                      float* c,
                      int64_t ldc);

}  // namespace hymoe::ops::detail
