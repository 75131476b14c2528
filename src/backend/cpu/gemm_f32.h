// hymoe's own fp32 GEMM for AVX-512 CPUs (backend/cpu/gemm_avx512.cpp), the fp32 counterpart of
// the bf16 GEMM of linear_bf16.cpp: ops::gemm and ops::gemm_w send it the products where it beats
// the OpenBLAS kernels this host runs (docs/guide/performance.md has the measurements).
#pragma once

#include <cstdint>

namespace hymoe::ops::detail {

// True when fp32 products may run f32_gemm_avx512: the CPU has AVX-512F/BW/VL and the portable
// kernels are not forced (set_weight_kernel, weight_gemm.cpp).
bool f32_avx512_on();

// C [m, n] = alpha · op(A) · op(B) + beta · C, row-major, with op(A) = A [m, k] (or Aᵀ for A
// [k, m] when trans_a) and op(B) = B [k, n] (or Bᵀ for B [n, k] when trans_b); beta = 0 does not
// read C. op(A) is packed in tiles of 6 rows, op(B) in panels of 64 columns, and a 6 × 64 register
// tile of fp32 FMAs runs over K blocks of 256; each output element is summed over k in order
// within a block and the blocks are added to C in order, so a row's result does not depend on m
// nor on the other rows (batch invariant by construction). Threads (OpenMP) split the panels,
// never k: any thread count gives the bits of one thread. Needs cpu_has_avx512().
void f32_gemm_avx512(bool trans_a,
                     bool trans_b,
                     int64_t m,
                     int64_t n,
                     int64_t k,
                     float alpha,
                     const float* a,
                     int64_t lda,
                     const float* b,
                     int64_t ldb,
                     float beta,
                     float* c,
                     int64_t ldc);

}  // namespace hymoe::ops::detail
