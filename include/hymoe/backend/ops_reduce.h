// Whole-tensor reductions as ops on a Ctx (the gradient norm of training,
// runtime/lora_grads.cpp): CPU forms (src/backend/cpu/reduce.cpp), then the ops on a Ctx: CPU,
// exactly the CPU forms; CUDA, the kernels of backend/cuda_reduce.h, the result read back to the
// host (the call waits for ctx's stream; the batched form once for all its tensors). The switch
// is src/backend/ops_train.cpp's.
#pragma once

#include <span>

#include "hymoe/backend/ctx.h"
#include "hymoe/tensor/tensor.h"

namespace hymoe::ops {

// Σ x² over every element of x (f32), summed in double in element order.
double sum_of_squares(const Tensor& x);

using backend::Ctx;

// On CUDA the sum's order is the kernel's (per-thread partials, then a tree), still in double.
double sum_of_squares(const Ctx& ctx, const Tensor& x);
// out[i] = sum_of_squares(ctx, xs[i]) for every i, each bit for bit that call's; CUDA: one copy
// of the sums to the host and one wait for all of them (the LoRA gradients' norm).
void sums_of_squares(const Ctx& ctx, std::span<const Tensor> xs, std::span<double> out);

}  // namespace hymoe::ops
