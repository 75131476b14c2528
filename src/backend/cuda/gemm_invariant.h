// The batch-invariant GEMM of Blas (inference.batch_invariant; src/backend/cuda/gemm.cu): every
// element of C is one fp32 fused multiply-add chain over k in ascending order, so a row of C
// depends only on its row of op(A), on op(B) and on k, never on m, n, the pointers' alignment or
// what else the call holds (cuBLAS picks its kernel, and with it the summation order, by shape
// and alignment). 16 × 16 tiles through shared memory; slower than cuBLAS.
#pragma once

#include <cstdint>

#include "hymoe/backend/cuda_arena.h"
#include "hymoe/core/types.h"

namespace hymoe::backend::cuda {

// C [m, n] = alpha · op(A) · op(B) + beta · C as Blas::gemm takes it (row-major, row strides;
// A and B f32 or bf16, C f32 or the inputs' dtype; beta = 0 does not read C), queued on s.
void gemm_invariant(const Stream& s,
                    DType in,
                    DType out,
                    bool trans_a,
                    bool trans_b,
                    int64_t m,
                    int64_t n,
                    int64_t k,
                    float alpha,
                    const void* a,
                    int64_t lda,
                    const void* b,
                    int64_t ldb,
                    float beta,
                    void* c,
                    int64_t ldc);

}  // namespace hymoe::backend::cuda
