// The elementwise and per-head pieces of the KDA block's backward (model/kda_backward.cpp,
// spec/model-math.md §3, §9) beside the scans: the recomputed q/k/v activations and decay gate
// with its derivative, the output's gated RMSNorm backward, the q/k/v activations' backward, the
// causal conv's time-reversed backward and σ's backward. fp32 tensors [rows, H·K] with heads of K
// contiguous values. CPU forms first (src/backend/cpu/kda_backward_ops.cpp: the block's loops,
// same order), then the ops on a Ctx: CPU, exactly the CPU forms; CUDA, the kernels of
// backend/cuda_kda_backward.h (tests/cuda compares them). The switch is
// src/backend/ops_train.cpp's.
#pragma once

#include <cstdint>
#include <optional>

#include "hymoe/backend/ctx.h"
#include "hymoe/backend/kda_batch.h"
#include "hymoe/tensor/tensor.h"

namespace hymoe::ops {

// out [n, D] = SiLU(c [n, D]); when l2, each head of K values then l2-normalised (l2_norm_rows,
// eps 1e-6) and multiplied by scale (q: K^{-1/2}; k: 1).
void kda_silu_l2(const Tensor& c, int64_t K, bool l2, float scale, Tensor& out);

// The decay gate with its derivative: g [n, D] holds the logits f and becomes g(z), z = f +
// dt_bias, a = e^{a_log[h]}; dg_dz [n, D] = ∂g/∂z:
//   g = −a·softplus(z), ∂g/∂z = −a·σ(z);  with a lower bound lb: g = lb·σ(a z),
//   ∂g/∂z = lb·a·σ(a z)(1 − σ(a z)).
void kda_decay_gate_grad(Tensor& g,
                         const Tensor& a_log,
                         const Tensor& dt_bias,
                         std::optional<float> lower_bound,
                         Tensor& dg_dz);

// The output's backward per head row (on = nrm ⊙ gate, nrm = RMSNorm(o; w) over K, gate = σ(·)),
// all [n, D] but w [K]: dgate = don ⊙ nrm ⊙ gate(1 − gate) (the gradient before σ), and
// dO = r (dm − m·mean(dm ⊙ m)), m = o·r, dm = don ⊙ gate ⊙ w, r = (mean o² + eps)^{-1/2},
// the row sums in fp32.
void kda_gated_norm_backward(const Tensor& o,
                             const Tensor& nrm,
                             const Tensor& gate,
                             const Tensor& w,
                             float eps,
                             const Tensor& don,
                             Tensor& dO,
                             Tensor& dgate);

// kda_silu_l2's backward in place: grad [n, D] holds ∂L/∂out and becomes ∂L/∂c, c [n, D] the
// forward's input (SiLU recomputed from it).
void kda_silu_l2_backward(const Tensor& c, int64_t K, bool l2, float scale, Tensor& grad);

// The causal depthwise conv's input gradient per sequence of t (each from a zero tail, nothing
// crossing sequences): du [n, D] (=) with du_s = Σ_i w[·, i] dc_{s+W−1−i} over the steps of s's
// sequence, w [D, W] (or [D, 1, W]). The CPU reads t.offsets, CUDA t.row_seq and t.offsets.
void causal_conv_backward(const KdaSeqTable& t, const Tensor& dc, const Tensor& w, Tensor& du);

// σ's backward in place: d ← d ⊙ s(1 − s), s = σ(·) the forward's output; same sizes.
void sigmoid_backward(const Tensor& s, Tensor& d);

using backend::Ctx;

void kda_silu_l2(const Ctx& ctx, const Tensor& c, int64_t K, bool l2, float scale, Tensor& out);
void kda_decay_gate_grad(const Ctx& ctx,
                         Tensor& g,
                         const Tensor& a_log,
                         const Tensor& dt_bias,
                         std::optional<float> lower_bound,
                         Tensor& dg_dz);
void kda_gated_norm_backward(const Ctx& ctx,
                             const Tensor& o,
                             const Tensor& nrm,
                             const Tensor& gate,
                             const Tensor& w,
                             float eps,
                             const Tensor& don,
                             Tensor& dO,
                             Tensor& dgate);
void kda_silu_l2_backward(
    const Ctx& ctx, const Tensor& c, int64_t K, bool l2, float scale, Tensor& grad);
void causal_conv_backward(
    const Ctx& ctx, const KdaSeqTable& t, const Tensor& dc, const Tensor& w, Tensor& du);
void sigmoid_backward(const Ctx& ctx, const Tensor& s, Tensor& d);

}  // namespace hymoe::ops
