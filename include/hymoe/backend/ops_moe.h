// The routed experts' data movement and products as ops on a Ctx (backend/moe_groups.h's layout):
// the gather of each computed assignment's input row into its expert's group, the experts' matrix
// as one grouped product over all groups, and the weighted combine of each row's slots in slot
// order. CPU forms first (plain host loops, fp32: the arithmetic the CPU's expert stage
// ran inline), then the ops; CUDA forms are moe.cu's permute/unpermute and the grouped cuBLAS GEMM.
// The switch is src/backend/ops_moe.cpp's.
#pragma once

#include <cstdint>
#include <vector>

#include "hymoe/backend/ctx.h"
#include "hymoe/tensor/tensor.h"

namespace hymoe::ops {

// in [n_rows, w] row row[a] = scale_a · x [n, w] row a / k for every slot a < n·k with row[a] ≥ 0
// (row: i64 [n·k]); scale_a = weight[a] (f32 [n·k]), or 1 when weight is null. Other rows of in
// are left alone.
void moe_gather(const Tensor& x, const Tensor& row, const float* weight, int64_t k, Tensor& in);
void moe_gather(const backend::Ctx& ctx, const Tensor& x, const Tensor& row, int64_t k, Tensor& in);

// y [n, w] row t = Σ over i < k with row[t·k+i] ≥ 0, in slot order, of weight[t·k+i] ·
// out [n_rows, w] row row[t·k+i] (weight f32 [n·k]; null on the CPU form: 1), summed in fp32;
// rows without a computed slot are zero. Overwrites y.
void moe_combine(const Tensor& out, const Tensor& row, const float* weight, int64_t k, Tensor& y);
void moe_combine(const backend::Ctx& ctx,
                 const Tensor& out,
                 const Tensor& row,
                 const Tensor& weight,
                 int64_t k,
                 Tensor& y);

// y [n_rows, out] rows of expert e (rows[e] of them, consecutive in expert order) = x [n_rows, in]
// rows of e · w[e]ᵀ, w[e] [out, in] (on the CPU empty where rows[e] = 0). On CUDA w[e] must be
// slice e of one stacked [E, out, in] tensor (the GPU model's), and the products run as one
// grouped launch (f32 x of bf16 w: x through a bf16 copy, y f32, one product per expert, as
// ops::linear); the CPU runs ops::linear per expert with rows.
void grouped_linear(const backend::Ctx& ctx,
                    const Tensor& x,
                    const std::vector<Tensor>& w,
                    const std::vector<int64_t>& rows,
                    Tensor& y);

}  // namespace hymoe::ops
