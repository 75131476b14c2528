// AdamW on the fp32 LoRA factors (decoupled weight decay, bias-corrected moments), the learning
// rate schedule (linear warmup, then cosine / linear decay to min_lr_ratio·lr, or constant) and
// gradient clipping by the global L2 norm. The update is an op on the trainer's Ctx (ops::adamw,
// backend/ops_backward.h) over tensors on its device: the factors, their gradients and the moments
// m, v. On the CPU the moments are host Buffers, which the checkpoints read; on a GPU they are
// held on the device and copied to those Buffers only for a checkpoint (download_state) and back
// after a resume (upload_state).
#pragma once

#include <cstdint>
#include <vector>

#include "hymoe/backend/ctx.h"
#include "hymoe/backend/held.h"
#include "hymoe/deck/deck.h"
#include "hymoe/model/weights.h"

namespace hymoe::runtime {

// The learning rate of step `step` (0-based) of `total`.
double learning_rate(const deck::OptimizerSection& o, int64_t step, int64_t total);

class AdamW {
public:
    // names: the parameters as named tensors (names, shapes and splits for the checkpoints);
    // params and grads: the same parameters' values and gradients on ctx's device, in that order
    // (f32). ctx's stream, arena and handle must outlive this.
    AdamW(const deck::OptimizerSection& o,
          const backend::Ctx& ctx,
          model::TensorList names,
          std::vector<Tensor> params,
          std::vector<Tensor> grads);
    // One update at learning rate lr with the gradients scaled by grad_scale (clipping);
    // t = the update count after this one (bias correction). Queued on ctx's stream.
    void step(double lr, double grad_scale, int64_t t);
    // The moments as named host tensors ("<param>.exp_avg", "<param>.exp_avg_sq"), for
    // checkpoints: current on the CPU, after download_state elsewhere; a resume loads them, then
    // calls upload_state.
    model::TensorList state();
    void download_state();  // device moments → host (complete when it returns; CPU: nothing)
    void upload_state();    // host moments → device (CPU: nothing)

private:
    bool on_host() const { return ctx_.device == Device::cpu; }
    deck::OptimizerSection o_;
    backend::Ctx ctx_;  // where the update runs
    model::TensorList names_;
    std::vector<Tensor> params_, grads_;
    std::vector<Buffer> m_, v_;                  // host moments (the update's on the CPU)
    std::vector<backend::Held> dm_, dv_;         // off the CPU: the update's moments there
    std::vector<Tensor> moments_m_, moments_v_;  // the update's: views of m_, v_ or dm_, dv_
};

}  // namespace hymoe::runtime
