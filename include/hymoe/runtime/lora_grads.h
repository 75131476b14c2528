// The LoRA gradients of one optimizer step across ranks. Each rank's backward leaves, in every
// factor it holds, the partial gradient of the rows and heads it computed; the whole gradient of
// a slice is the sum over the ranks that hold that slice:
//   attention, dense FFN and shared-expert factors   split over tp: dp;  whole: tp then dp
//   routed-expert factors, one adapter per expert   split over etp: edp; whole: etp then edp
//   one adapter shared by a layer's routed experts  as per expert, and over ep as well
// After the sums every holder has the same gradient, so the optimizer keeps the copies equal.
#pragma once

#include "hymoe/model/lora_model.h"
#include "hymoe/parallel/comms.h"

namespace hymoe::runtime {

// Sums every gradient of adapter 0 over its holders (one packed all-reduce per group).
void sum_lora_gradients(model::LoraModel& lm, const parallel::Comms& comms);

// Σ of the squared gradients of the whole model (every slice once), on every rank: the global
// gradient norm squared. Call after sum_lora_gradients.
double lora_grad_sum_of_squares(model::LoraModel& lm, const parallel::Comms& comms);

}  // namespace hymoe::runtime
