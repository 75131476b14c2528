// A LoRA adapter's share of a projection on a list of rows, as an op on a Ctx: the form a batch's
// adapters take when each adapter's rows are known as an index list on the device (model/
// lora_views.h), one gather, two products and one scatter per (adapter, projection). The CPU's
// blocks add their host adapters run by run instead (model/lora.h lora_forward, with dropout);
// this op's CPU form is the same arithmetic in plain host code. The switch is
// src/backend/ops.cpp's.
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

}  // namespace hymoe::ops
