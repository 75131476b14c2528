// The elementwise ops of the KDA block (model/kda.cpp, spec/model-math.md §3) beside the scans:
// the decay gate, the per-head l2 norm, the q scaling and the output gate. CPU forms first (fp32
// host tensors, src/backend/cpu/kda_ops.cpp), then the same ops on a Ctx (backend/ctx.h): CPU,
// exactly the CPU forms; CUDA, the kernels of backend/cuda_ops.h (tests/cuda compares them). The
// device switch is src/backend/ops.cpp's.
#pragma once

#include <optional>

#include "hymoe/backend/ctx.h"
#include "hymoe/tensor/tensor.h"

namespace hymoe::ops {

// KDA's decay gate in place, fp32: g [n_tok, H·K] holds the decay logits f and becomes, with
// z = f + dt_bias [H·K] and a = e^{a_log[h]} (a_log: H values, any shape),
//   −a · softplus(z)    or, with a lower bound lb,   lb · σ(a · z).
void kda_decay_gate(Tensor& g,
                    const Tensor& a_log,
                    const Tensor& dt_bias,
                    std::optional<float> lower_bound);
// x ← c · x (KDA's q · K^{-1/2})
void scale_inplace(Tensor& x, float c);
// x ← x ⊙ y, same number of elements (KDA's output gate)
void mul_inplace(Tensor& x, const Tensor& y);

using backend::Ctx;

void kda_decay_gate(const Ctx& ctx,
                    Tensor& g,
                    const Tensor& a_log,
                    const Tensor& dt_bias,
                    std::optional<float> lower_bound);
// ops::l2_norm_rows over the rows of x.dim(-1), in place.
void l2_norm_rows(const Ctx& ctx, Tensor& x, float eps = 1e-6f);
void scale_inplace(const Ctx& ctx, Tensor& x, float c);
void mul_inplace(const Ctx& ctx, Tensor& x, const Tensor& y);

}  // namespace hymoe::ops
