// Matrix products on the GPU through cuBLAS, row-major like ops::gemm / ops::linear
// (hymoe/backend/ops.h): fp32 (fp32 compute, no TF32, so it matches the CPU to ~1e-6) and bf16
// inputs with fp32 accumulation (bf16 or fp32 output), plus one grouped GEMM per MoE layer for
// its experts (cublasGemmGroupedBatchedEx: one launch, not one per expert), and the attention core
// built on them. CUDA builds only (src/backend/cuda/gemm.cu, attention.cu); no CUDA header here.
#pragma once

#include <cstdint>
#include <vector>

#include "hymoe/backend/cuda_arena.h"
#include "hymoe/tensor/tensor.h"

struct cublasContext;  // = cublasHandle_t's pointee
struct CUevent_st;     // = cudaEvent_t's pointee

namespace hymoe::backend::cuda {

// A cuBLAS handle bound to one stream. Its workspace and the grouped GEMM's pointer tables (up to
// max_groups experts) come from `arena` at construction and go back to it at destruction, so no
// call allocates. Calls are asynchronous on the stream, like kernels.
class Blas {
public:
    Blas(const Stream& stream, DeviceArena& arena, int max_groups = 1024);
    ~Blas();
    Blas(const Blas&) = delete;
    Blas& operator=(const Blas&) = delete;

    // C [m, n] = alpha · op(A) · op(B) + beta · C, row-major, lda/ldb/ldc row strides (as
    // ops::gemm). A and B of dtype `in` (f32 or bf16), C of dtype `out` (f32, or bf16 with bf16
    // inputs); fp32 accumulation throughout.
    void gemm(DType in,
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
    // y [n, out] = x [n, in] · w [out, in]ᵀ (+ beta · y), device tensors; x and w of one dtype.
    void linear(const Tensor& x, const Tensor& w, Tensor& y, float beta = 0.0f);
    // The experts of one MoE layer in one launch: x [n_rows, in] holds the rows routed to expert
    // e contiguously, in expert order, rows[e] of them (Σ rows = n_rows); w [E, out, in];
    // y [n_rows, out] rows of expert e = x rows of e · w[e]ᵀ. Experts with no rows are skipped.
    // x, w, y of one dtype (f32 or bf16), fp32 accumulation; or bf16 x and w into an f32 y, one
    // product per expert (the grouped GEMM writes bf16 only).
    void grouped_linear(const Tensor& x,
                        const Tensor& w,
                        const std::vector<int64_t>& rows,
                        Tensor& y);
    const Stream& stream() const { return stream_; }

private:
    const Stream& stream_;
    DeviceArena& arena_;
    int max_groups_;
    cublasContext* handle_ = nullptr;
    void* workspace_ = nullptr;
    void** tables_ = nullptr;    // device [3, max_groups]: A, B, C pointers of a grouped call
    PinnedBuffer host_tables_;   // its host staging
    CUevent_st* tables_copied_;  // recorded after the staging copy: the staging is free again
};

// ops::attention_core on the device (src/backend/cuda/attention.cu), f32 device tensors:
// scratch [n_q, n_k] = mask, += τ q [n_q, d_qk] · k [n_k, d_qk]ᵀ (one GEMM with beta 1), softmax
// over its rows (a fully masked row gives zeros), o [n_q, d_v] = scratch · v [n_k, d_v].
void attention_core(Blas& blas,
                    const Tensor& q,
                    const Tensor& k,
                    const Tensor& v,
                    const Tensor& mask,
                    float tau,
                    Tensor& scratch,
                    Tensor& o);

}  // namespace hymoe::backend::cuda
