// A LoRA adapter's share of a projection on a list of rows, and its backward, as ops on a Ctx: the
// form a batch's adapters take when each adapter's rows are known as an index list on the device
// (model/lora_views.h), one gather, the products and one scatter per (adapter, projection). The
// CPU's blocks add their host adapters run by run instead (model/lora.h, with dropout), through
// lora_pair_backward's CPU form on each run; the row ops' CPU forms are the same arithmetic in
// plain host code. The switch is src/backend/ops.cpp's.
#pragma once

#include "hymoe/backend/ctx.h"
#include "hymoe/tensor/tensor.h"

namespace hymoe::ops {

// y [n, out] rows `rows` (i64 [m], distinct) += scale · (x [n, in] rows) Aᵀ Bᵀ, A [r, in] and
// B [out, r]; everything fp32 (on CUDA, x and y may be bf16: the rows are summed in fp32 and y
// rounded back once). CPU form, then the op on a Ctx.
void lora_rows_add(
    const Tensor& rows, const Tensor& A, const Tensor& B, float scale, const Tensor& x, Tensor& y);
void lora_rows_add(const backend::Ctx& ctx,
                   const Tensor& rows,
                   const Tensor& A,
                   const Tensor& B,
                   float scale,
                   const Tensor& x,
                   Tensor& y);

// The adapter's backward on m rows of its input, fp32: x [m, in] the adapter's input (dropout
// applied), dy [m, out]; with t = x Aᵀ and g = dy B [m, r]:
//   dB [out, r] += scale · dyᵀ t,  dA [r, in] += scale · gᵀ x  (both skipped when dA is empty: a
//   frozen adapter),  dx [m, in] = scale · g A  (beta = 1: +=).
// CPU form (ops::linear and ops::gemm, lora.h's order), then the op on a Ctx.
void lora_pair_backward(const Tensor& A,
                        const Tensor& B,
                        float scale,
                        const Tensor& x,
                        const Tensor& dy,
                        Tensor& dA,
                        Tensor& dB,
                        Tensor& dx,
                        float beta = 0.0f);
void lora_pair_backward(const backend::Ctx& ctx,
                        const Tensor& A,
                        const Tensor& B,
                        float scale,
                        const Tensor& x,
                        const Tensor& dy,
                        Tensor& dA,
                        Tensor& dB,
                        Tensor& dx,
                        float beta = 0.0f);

// lora_rows_add's backward: lora_pair_backward on the rows `rows` (i64 [m], distinct) of x [n, in]
// and dy [n, out], those rows of dx [n, in] accumulated (+=); fp32. CPU form, then on a Ctx.
void lora_rows_backward(const Tensor& rows,
                        const Tensor& A,
                        const Tensor& B,
                        float scale,
                        const Tensor& x,
                        const Tensor& dy,
                        Tensor& dA,
                        Tensor& dB,
                        Tensor& dx);
void lora_rows_backward(const backend::Ctx& ctx,
                        const Tensor& rows,
                        const Tensor& A,
                        const Tensor& B,
                        float scale,
                        const Tensor& x,
                        const Tensor& dy,
                        Tensor& dA,
                        Tensor& dB,
                        Tensor& dx);

}  // namespace hymoe::ops
