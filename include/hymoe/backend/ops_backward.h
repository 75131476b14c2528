// Backward passes of the elementwise and normalisation ops (spec/model-math.md §9), row-major
// fp32 on the CPU, in the same per-row convention as backend/ops.h.
#pragma once

#include "hymoe/tensor/tensor.h"

namespace hymoe::ops {

// Backward of y = w ⊙ x·r, r = (mean x² + eps)^{-1/2} per row (w frozen):
//   n = x·r, dn = dy ⊙ w, dx = r·(dn − n·mean(dn ⊙ n)). dx may alias dy.
void rms_norm_backward(const Tensor& x, const Tensor& w, float eps, const Tensor& dy, Tensor& dx);

}  // namespace hymoe::ops
