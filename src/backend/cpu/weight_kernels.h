// The kernels behind ops::gemm_w for 16-bit weights (backend/cpu/weight_gemm.cpp dispatches):
// the AVX-512 ones live in linear_bf16.cpp, compiled with -mavx512bf16 and called only after a
// run-time cpuid check. All compute C [m, n] = alpha · A [m, k] · Wᵀ + beta · C for a bf16
// W [n, k] (row stride ldw) and fp32 A, C; beta = 0 does not read C.
#pragma once

#include <cstdint>

namespace hymoe::ops::detail {

// True when this CPU (and OS) runs AVX-512F/BW and AVX512_BF16 instructions.
bool cpu_has_avx512_bf16();
// ops::set_batch_invariant's setting (ops.cpp).
bool batch_invariant_on();

// A few rows (decode): A rounded to bf16 once, each weight row read once and dotted with its rows
// by VDPBF16PS (fp32 accumulators), eight weight rows per pass (four for m > 2). Any m; meant for m
// ≤ 4. The activations are rounded as in the GEMM, so the two kernels differ by fp32 rounding only.
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
