// Backward passes of the elementwise and normalisation ops (spec/model-math.md §9), row-major
// fp32 on the CPU, in the same per-row convention as backend/ops.h. Weights are frozen: each op
// returns only the gradient of its input, written (=, not +=) unless it takes a beta.
#pragma once

#include <cstdint>

#include "hymoe/backend/ops.h"
#include "hymoe/tensor/tensor.h"

namespace hymoe::ops {

// Backward of y = w ⊙ x·r, r = (mean x² + eps)^{-1/2} per row (w frozen):
//   n = x·r, dn = dy ⊙ w, dx = r·(dn − n·mean(dn ⊙ n)). dx may alias dy.
void rms_norm_backward(const Tensor& x, const Tensor& w, float eps, const Tensor& dy, Tensor& dx);

// Input gradient of ops::linear (y = x wᵀ, w frozen): dx [n, in] = dy [n, out] · w [out, in]
// (beta = 1: dx += ...).
void linear_backward(const Tensor& dy, const Tensor& w, Tensor& dx, float beta = 0.0f);

// Backward of ops::softmax_rows in place: dp ← p ⊙ (dp − Σ_j p_j dp_j) per row of n, with
// p the softmax output [rows, n] and dp its gradient [rows, n] (entries with p = 0, the masked
// ones, get 0).
void softmax_rows_backward(const float* p, float* dp, int64_t rows, int64_t n);

// Backward of ops::rope, in place on the gradient, same arguments: RoPE multiplies each pair by
// mscale·R(pos·θ_i), so the gradient is multiplied by its transpose mscale·R(−pos·θ_i).
void rope_backward(float* dx,
                   int64_t n_tok,
                   int64_t n_head,
                   int64_t token_stride,
                   int64_t head_stride,
                   const int64_t* pos,
                   const RopeFreqs& freqs,
                   bool interleaved);

}  // namespace hymoe::ops
