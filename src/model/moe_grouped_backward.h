// The routed experts' backward in the grouped form, on any Ctx: the expert side of the MoE
// layer's backward (moe_backward.cpp). The groups are planned on the host as the forward's
// (moe_grouped.h), each expert's forward is recomputed on its group (one grouped product per
// matrix, its adapters on its own rows), then its backward for the weighted output gradient: the
// down, activation and up/gate steps of dense_ffn_backward (ffn_backward.cpp) over every group
// at once (the input products one ops::linear_backward per expert), the slot-ordered sum of the
// input gradients and each slot's combine-weight gradient. On a CPU context every expert's
// arithmetic is the same calls on the same rows as dense_ffn_backward on its group. Private to
// src/model.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "hymoe/backend/ctx.h"
#include "hymoe/model/ffn.h"
#include "moe_experts.h"
#include "moe_grouped.h"

namespace hymoe::model::detail {

// For in [n, w] and its output gradient g [n, w] (f32, on ctx's device) and the slots on the
// host: d_in [n, w] = Σ over each row's slots (slot order) of the expert's input gradient for
// weight · g; dw [n, k] f32 = g · Expert(in row) per computed slot, 0 elsewhere. The experts'
// adapters (host slots on a CPU context, factor views with gradient views on either) accumulate
// their gradients. poll() runs after the recomputed forward and after the backward;
// tokens_per_expert [E] += the rows each expert ran on.
void experts_grouped_backward(const backend::Ctx& ctx,
                              const ExpertViews& w,
                              ExpertAct act,
                              const RowSlots& slots,
                              const Tensor& in,  // [n, w]
                              const Tensor& g,   // [n, w]
                              Tensor& d_in,      // [n, w]
                              Tensor& dw,        // [n, k]
                              const std::function<void()>& poll,
                              std::vector<int64_t>& tokens_per_expert);

}  // namespace hymoe::model::detail
