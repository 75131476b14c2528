// CUDA kernels of the routed experts' backward pieces (backend/ops_moe_backward.h), queued on a
// stream (src/backend/cuda/moe_backward.cu), f32: one thread per (slot, column) for the scaled
// gather, one warp per slot for the combine weights' gradient. Called through the ops on a Ctx
// (src/backend/ops_moe_backward.cpp), which checks the devices.
#pragma once

#include <cstdint>

#include "hymoe/tensor/tensor.h"

namespace hymoe::backend::cuda {

class Stream;

void moe_gather_scaled(const Stream& s,
                       const Tensor& x,
                       const Tensor& row,
                       const Tensor& weight,
                       int64_t k,
                       Tensor& in);
void moe_slot_dot(
    const Stream& s, const Tensor& g, const Tensor& out, const Tensor& row, int64_t k, Tensor& dw);

}  // namespace hymoe::backend::cuda
