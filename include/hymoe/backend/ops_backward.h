// Backward passes of the elementwise and normalisation ops (spec/model-math.md §9), row-major
// fp32 on the CPU, in the same per-row convention as backend/ops.h, and the AdamW update of the
// trained tensors. Weights are frozen: each op returns only the gradient of its input, written
// (=, not +=) unless it takes a beta. The CPU forms first, then the same ops on a Ctx
// (backend/ctx.h): CPU, exactly the CPU forms; CUDA, the kernels of backend/cuda_backward.h and
// the products of cuda_gemm.h (tests/cuda compares them). The device switch is
// src/backend/ops_train.cpp's.
#pragma once

#include <cstdint>

#include "hymoe/backend/ctx.h"
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

// The MLP's activations backward, in place, elementwise over [n, I] (dh the gradient of the
// activation's output):
//   swiglu: h = SiLU(gate) ⊙ up:  gate ← dh ⊙ up ⊙ σ(g)(1 + g(1 − σ(g))),  up ← dh ⊙ SiLU(g);
//   relu2:  h = ReLU(up)²:        up ← dh ⊙ 2·ReLU(up).
void swiglu_backward(Tensor& gate, Tensor& up, const Tensor& dh);
void relu2_backward(Tensor& up, const Tensor& dh);

// The backward of a sigmoid gate u = o ⊙ g, g = σ(z) (attention's output gate), elementwise:
// dz = du ⊙ o ⊙ g(1 − g), then du ← du ⊙ g (the gradient of o). dz may not alias the others.
void sigmoid_gate_backward(Tensor& du, const Tensor& o, const Tensor& g, Tensor& dz);

// One AdamW update of a tensor (decoupled weight decay, bias-corrected moments), elementwise in
// double: with gs = grad_scale·g, m ← β1 m + (1 − β1) gs, v ← β2 v + (1 − β2) gs², then
// p ← p(1 − lr·wd) − lr·(m/c1) / (√(v/c2) + eps); c1 = 1 − β1ᵗ, c2 = 1 − β2ᵗ (the caller's).
// p, g, m, v f32 of one size; m, v stored in f32.
struct AdamWStep {
    double lr = 0, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
    double c1 = 1, c2 = 1;    // bias corrections
    double grad_scale = 1.0;  // clipping
};
void adamw(Tensor& p, const Tensor& g, Tensor& m, Tensor& v, const AdamWStep& s);

using backend::Ctx;

void rms_norm_backward(
    const Ctx& ctx, const Tensor& x, const Tensor& w, float eps, const Tensor& dy, Tensor& dx);
// dx [n, in] (+)= dy [n, out] · w [out, in]; on CUDA w of dy's dtype.
void linear_backward(
    const Ctx& ctx, const Tensor& dy, const Tensor& w, Tensor& dx, float beta = 0.0f);
// softmax_rows_backward over the rows of p, dp (their last dimension), dp in place.
void softmax_rows_backward(const Ctx& ctx, const Tensor& p, Tensor& dp);
// rope_backward on the rows of x [n_tok, width], the arguments of ops::rope on a Ctx
// (backend/ops_attention.h): the forward's positions pos [n_tok] int64 on ctx's device.
void rope_backward(const Ctx& ctx,
                   Tensor& x,
                   int64_t col0,
                   int64_t n_head,
                   int64_t head_stride,
                   const Tensor& pos,
                   const RopeFreqs& freqs,
                   bool interleaved);
void swiglu_backward(const Ctx& ctx, Tensor& gate, Tensor& up, const Tensor& dh);
void relu2_backward(const Ctx& ctx, Tensor& up, const Tensor& dh);
void sigmoid_gate_backward(
    const Ctx& ctx, Tensor& du, const Tensor& o, const Tensor& g, Tensor& dz);
void adamw(const Ctx& ctx, Tensor& p, const Tensor& g, Tensor& m, Tensor& v, const AdamWStep& s);

}  // namespace hymoe::ops
