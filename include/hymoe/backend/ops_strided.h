// Ops on a Ctx over matrices that sit inside a tensor's storage at a row stride (a head's columns
// of a packed [n, H·d] activation, a block of rows): the fp32 product, the copy of a block and
// the causal softmax of a block of scores. The MLA/DSA block's backward sweeps per sequence, head
// and query block through them (model/attention_backward_views.h). CPU: ops::gemm, memcpy per row
// and ops::softmax_rows on the CPU forms' pointers, bit for bit what host loops over the same
// pointers give; CUDA: Blas::gemm (cuda_gemm.h), copy_2d and causal_softmax (cuda_model_ops.h).
// tests/cuda compares them. The switch is src/backend/ops_strided.cpp's.
#pragma once

#include <cstdint>

#include "hymoe/backend/ctx.h"
#include "hymoe/tensor/tensor.h"

namespace hymoe::ops {

using backend::Ctx;

// A matrix in t's storage: element (i, j) at element offset + i·ld + j of t (f32). Each op checks
// that the rows and columns it touches lie inside t.
struct MatRef {
    Tensor t;
    int64_t offset = 0;
    int64_t ld = 0;
};

// C [m, n] = alpha · op(A) · op(B) + beta · C, op = transpose when trans_* (ops::gemm's
// arguments, each matrix a MatRef), f32.
void gemm(const Ctx& ctx,
          bool trans_a,
          bool trans_b,
          int64_t m,
          int64_t n,
          int64_t k,
          float alpha,
          const MatRef& a,
          const MatRef& b,
          float beta,
          const MatRef& c);

// dst [rows, cols] ← src [rows, cols], f32 (no overlap).
void copy_block(const Ctx& ctx, int64_t rows, int64_t cols, const MatRef& src, const MatRef& dst);

// scores [n_q, n_k] f32 in place, row i a query at position pos_first + i: entries u > pos_first +
// i → −inf, the others + mask[i, u] (mask [n_q, n_k] of 0 and −inf, the DSA top-k; null: none),
// then softmax per row (−inf → 0; a row with no key left → zeros).
void causal_softmax(const Ctx& ctx, Tensor& scores, int64_t pos_first, const Tensor* mask);

}  // namespace hymoe::ops
