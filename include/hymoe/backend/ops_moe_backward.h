// The routed experts' backward pieces as ops on a Ctx (model/moe_backward.cpp), beside the
// forward's of backend/ops_moe.h: the scaled gather of each computed slot's output gradient into
// its expert's group, the combine weights' gradient (each slot's output gradient · its expert's
// recomputed output), and the column placement that joins and splits the dispatch's [u | g] and
// [d_u | dw] rows. CPU forms first (src/backend/cpu/moe_backward_ops.cpp, the loops
// the CPU's expert stage and moe_backward.cpp ran), then the ops: CPU, exactly the CPU forms;
// CUDA, the kernels of backend/cuda_moe_backward.h and cuda_model_ops.h's copy_2d (tests/cuda
// compares them). The switch is src/backend/ops_moe_backward.cpp's.
#pragma once

#include <cstdint>

#include "hymoe/backend/ctx.h"
#include "hymoe/tensor/tensor.h"

namespace hymoe::ops {

// dw [n, k] f32: dw[a] = Σ_c g [n, w] row a / k · out [n_rows, w] row row[a] (the sum in column
// order, fp32) for every slot a with row[a] ≥ 0 (row: i64 [n·k]), 0 elsewhere.
void moe_slot_dot(const Tensor& g, const Tensor& out, const Tensor& row, int64_t k, Tensor& dw);

using backend::Ctx;

// ops::moe_gather (backend/ops_moe.h) with each slot's scale: in row row[a] = weight[a] · x row
// a / k (weight f32 [n·k] on ctx's device), f32.
void moe_gather_scaled(const Ctx& ctx,
                       const Tensor& x,
                       const Tensor& row,
                       const Tensor& weight,
                       int64_t k,
                       Tensor& in);
void moe_slot_dot(
    const Ctx& ctx, const Tensor& g, const Tensor& out, const Tensor& row, int64_t k, Tensor& dw);
// dst [n, width] columns [col0, col0 + w) = src [n, w]; dst's other columns untouched (the
// converse of ops::copy_cols); f32 or bf16, src and dst alike.
void place_cols(const Ctx& ctx, const Tensor& src, int64_t col0, Tensor& dst);

}  // namespace hymoe::ops
