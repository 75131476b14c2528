// AdamW on the fp32 LoRA factors (decoupled weight decay, bias-corrected moments), the learning
// rate schedule (linear warmup, then cosine / linear decay to min_lr_ratio·lr, or constant) and
// gradient clipping by the global L2 norm. The update is an op on a Ctx (ops::adamw,
// backend/ops_backward.h): the parameters, gradients and moments live on the optimizer's device
// (the CPU's so far: the moments are host Buffers).
#pragma once

#include <cstdint>

#include "hymoe/backend/ctx.h"
#include "hymoe/deck/deck.h"
#include "hymoe/model/weights.h"

namespace hymoe::runtime {

// The learning rate of step `step` (0-based) of `total`.
double learning_rate(const deck::OptimizerSection& o, int64_t step, int64_t total);

class AdamW {
public:
    // params and grads: the same tensors' values and gradients, in the same order.
    AdamW(const deck::OptimizerSection& o, model::TensorList params, model::TensorList grads);
    // One update at learning rate lr with the gradients scaled by grad_scale (clipping);
    // t = the update count after this one (bias correction).
    void step(double lr, double grad_scale, int64_t t);
    // The moments as named tensors ("<param>.exp_avg", "<param>.exp_avg_sq"), for checkpoints.
    model::TensorList state();

private:
    deck::OptimizerSection o_;
    backend::Ctx ctx_ = backend::cpu_ctx();  // where the update runs
    model::TensorList params_, grads_;
    std::vector<Buffer> m_, v_;
};

}  // namespace hymoe::runtime
