// CUDA kernels of the KDA backward's pieces (backend/ops_kda_backward.h), fp32 device tensors,
// queued on a stream (src/backend/cuda/kda_backward.cu): one thread per element, or per head row
// of K values where a row sum is needed (summed in fp32 in the CPU forms' order), and one
// sequence's recurrence backward. Called through the ops on a Ctx (src/backend/ops.cpp), which
// checks the devices.
#pragma once

#include <cstdint>

#include "hymoe/backend/kda_batch.h"
#include "hymoe/backend/kda_params.h"
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

// The recurrence's backward for one sequence (ops::kda_scan_backward_tokens' arithmetic,
// src/backend/cuda/kda_scan_backward.cu): every pointer of p, ckpt [⌈T/chunk⌉, H, K, V] and d a
// device pointer; work holds kda_scan_backward_work(H, K, V, chunk) floats (per head one chunk's
// recomputed states [chunk + 1, K, V], its p and u [chunk, V], ∂L/∂S [K, V] and du [V]). One
// thread block per head, sequential over the tokens.
int64_t kda_scan_backward_work(int n_head, int d_k, int d_v, int chunk);
void kda_scan_backward(const Stream& s,
                       const ops::KdaScanParams& p,
                       const float* ckpt,
                       const ops::KdaScanGrads& d,
                       int chunk,
                       float* work);

}  // namespace hymoe::backend::cuda
