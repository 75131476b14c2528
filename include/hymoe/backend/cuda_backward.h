// CUDA kernels of the backward ops and the AdamW update (backend/ops_backward.h), queued on a
// stream; device tensors, fp32 (backend/cuda/backward.cu). Same semantics as the CPU forms; the
// row statistics of rms_norm_backward and softmax_rows_backward reduce in double, as theirs.
// Called through the ops on a Ctx (src/backend/ops.cpp), which checks the devices.
#pragma once

#include "hymoe/backend/ops_backward.h"
#include "hymoe/tensor/tensor.h"

namespace hymoe::backend::cuda {

class Stream;

void rms_norm_backward(
    const Stream& s, const Tensor& x, const Tensor& w, float eps, const Tensor& dy, Tensor& dx);
// dp [rows, n] ← p ⊙ (dp − Σ p dp) per row, in place.
void softmax_rows_backward(const Stream& s, const Tensor& p, Tensor& dp);
// dst [n] = −src [n], int64 (rope_backward's positions).
void negate_i64(const Stream& s, const Tensor& src, Tensor& dst);
void swiglu_backward(const Stream& s, Tensor& gate, Tensor& up, const Tensor& dh);
void relu2_backward(const Stream& s, Tensor& up, const Tensor& dh);
void sigmoid_gate_backward(
    const Stream& s, Tensor& du, const Tensor& o, const Tensor& g, Tensor& dz);
void adamw(
    const Stream& s, Tensor& p, const Tensor& g, Tensor& m, Tensor& v, const ops::AdamWStep& step);

}  // namespace hymoe::backend::cuda
