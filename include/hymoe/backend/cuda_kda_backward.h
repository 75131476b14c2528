// CUDA kernels of the KDA backward's pieces (backend/ops_kda_backward.h), fp32 device tensors,
// queued on a stream (src/backend/cuda/kda_backward.cu): one thread per element, or per head row
// of K values where a row sum is needed (summed in fp32 in the CPU forms' order). Called through
// the ops on a Ctx (src/backend/ops.cpp), which checks the devices.
#pragma once

#include "hymoe/backend/kda_batch.h"
#include "hymoe/tensor/tensor.h"

namespace hymoe::backend::cuda {

class Stream;

void kda_silu_l2(const Stream& s, const Tensor& c, int64_t K, bool l2, float scale, Tensor& out);
void kda_decay_gate_grad(const Stream& s,
                         Tensor& g,
                         const Tensor& a_log,
                         const Tensor& dt_bias,
                         bool has_lower_bound,
                         float lower_bound,
                         Tensor& dg_dz);
void kda_gated_norm_backward(const Stream& s,
                             const Tensor& o,
                             const Tensor& nrm,
                             const Tensor& gate,
                             const Tensor& w,
                             float eps,
                             const Tensor& don,
                             Tensor& dO,
                             Tensor& dgate);
void kda_silu_l2_backward(
    const Stream& s, const Tensor& c, int64_t K, bool l2, float scale, Tensor& grad);
void causal_conv_backward(
    const Stream& s, const ops::KdaSeqTable& t, const Tensor& dc, const Tensor& w, Tensor& du);
void sigmoid_backward(const Stream& s, const Tensor& sg, Tensor& d);

}  // namespace hymoe::backend::cuda
