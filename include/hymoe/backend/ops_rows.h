// Row moves by an index list as ops on a Ctx (the loss head's rows with a target,
// model/train.cpp): CPU forms (src/backend/cpu/rows.cpp, plain copies), then the ops on a Ctx:
// CPU, exactly the CPU forms; CUDA, cuda::gather_rows / scatter_rows (backend/cuda_model_ops.h).
// The switch is src/backend/ops.cpp's.
#pragma once

#include "hymoe/backend/ctx.h"
#include "hymoe/tensor/tensor.h"

namespace hymoe::ops {

// dst [m, w] row i = src [n, w] row idx[i]; idx i64 [m], each in [0, n). f32 (or bf16), alike.
void gather_rows(const Tensor& src, const Tensor& idx, Tensor& dst);
// dst [n, w] row idx[i] = src [m, w] row i (distinct idx); dst's other rows untouched.
void scatter_rows(const Tensor& src, const Tensor& idx, Tensor& dst);

using backend::Ctx;

void gather_rows(const Ctx& ctx, const Tensor& src, const Tensor& idx, Tensor& dst);
void scatter_rows(const Ctx& ctx, const Tensor& src, const Tensor& idx, Tensor& dst);

}  // namespace hymoe::ops
