// The LoRA gradients of one optimizer step across ranks. Each rank's backward leaves, in every
// factor it holds, the partial gradient of the rows and heads it computed; the whole gradient of
// a slice is the sum over the ranks that hold that slice:
//   attention, dense FFN and shared-expert factors   split over tp: dp;  whole: tp then dp
//   routed-expert factors, one adapter per expert   split over etp: edp; whole: etp then edp
//   one adapter shared by a layer's routed experts  as per expert, and over ep as well
// After the sums every holder has the same gradient, so the optimizer keeps the copies equal.
// The gradients are the trainer's tensors on its Ctx (model/lora_factors.h TrainableLora: the
// host slots on the CPU, device tensors on a GPU, summed there over NCCL); only scalars reach the
// host.
#pragma once

#include <span>

#include "hymoe/backend/ctx.h"
#include "hymoe/model/lora_model.h"
#include "hymoe/parallel/comms.h"

namespace hymoe::runtime {

// Sums every gradient of lm's adapter 0 over its holders (one packed all-reduce per group).
// grads: those gradients on ctx's device, in lm.tensors(0, true) order.
void sum_lora_gradients(model::LoraModel& lm,
                        const backend::Ctx& ctx,
                        std::span<Tensor> grads,
                        const parallel::Comms& comms);

struct LoraGradNorm {
    double sum_of_squares = 0;  // Σ g² over the whole model (every slice once), on every rank
    int nonfinite_layer = -1;   // the first layer (module order) with a non-finite gradient
                                // on this rank, or −1
};

// The global gradient norm squared, and where this rank's gradients stop being finite. Call
// after sum_lora_gradients (same arguments).
LoraGradNorm lora_grad_norm(model::LoraModel& lm,
                            const backend::Ctx& ctx,
                            std::span<const Tensor> grads,
                            const parallel::Comms& comms);

}  // namespace hymoe::runtime
