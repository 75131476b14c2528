// The routed experts on a set of rows in the grouped form, on any Ctx: the expert groups
// (backend/moe_groups.h) planned on the host from the rows' slots, their row map and weights
// copied to ctx's device, then the gather into groups, one grouped product per matrix over every
// expert (backend/ops_moe.h), the activation over every grouped row, each expert's adapters on
// its own rows, and the slot-ordered combine. On a CPU context it equals one dense_ffn_forward
// per expert on its rows bit for bit (tests/unit/model/test_moe_grouped.cpp): each expert's
// products and adapters are the same calls on the same rows. The routed experts of every
// MoE forward (moe.cpp) on any Ctx; private to src/model.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "hymoe/backend/ctx.h"
#include "hymoe/backend/moe_groups.h"
#include "hymoe/backend/ops_attention.h"  // ops::upload
#include "hymoe/model/ffn.h"
#include "hymoe/model/ffn_views.h"
#include "hymoe/model/moe_views.h"
#include "moe_experts.h"

namespace hymoe::model::detail {

// A copy on ctx's device of host values v, in `scratch` (ops::upload): a 1-D tensor of dtype
// (of T's size).
template <class T>
Tensor copied(const backend::Ctx& ctx,
              backend::Scratch& scratch,
              const std::vector<T>& v,
              DType dtype) {
    Tensor dst = scratch(dtype, {static_cast<int64_t>(v.size())});
    const Tensor src{const_cast<T*>(v.data()), dtype, Device::cpu, dst.shape};
    ops::upload(ctx, src, dst);
    return dst;
}

// One grouped call's plan on ctx's device (its tensors in scratch): the expert groups
// (backend/moe_groups.h) of the slots, each expert's rows (added to tokens_per_expert; an expert
// with rows must be held), the row map and combine weights uploaded, and each expert's rows as a
// call of its own for its adapters: each grouped row's adapter (slots.adapter; null: 0), the host
// slots' batch, and, when w has factor-view adapters, each expert's rows per adapter numbered
// from its group's first row.
struct GroupedCall {
    backend::MoeGroups g;
    std::vector<int64_t> counts;                       // [E] rows of each expert
    Tensor row;                                        // i64 [n·k] g.row on the device
    Tensor weight;                                     // f32 [n·k] the slots' combine weights
    std::vector<int> adapter;                          // [n_rows]
    std::vector<std::vector<LoraRowsView>> lora_rows;  // [E] by adapter (empty without views)
};
GroupedCall grouped_call(const backend::Ctx& ctx,
                         backend::Scratch& scratch,
                         const MoeExpertViews& w,
                         const RowSlots& slots,
                         std::vector<int64_t>& tokens_per_expert);

// The routed experts' matrices on one device (model/moe_views.h), [E] each from host weights.
using ExpertViews = MoeExpertViews;
ExpertViews expert_views(const MoeWeights& w);

// out [n, w] = Σ over each row's slots (slot order) of weight · Expert(in row), for in [n, w] on
// ctx's device and the slots on the host (slots.adapter: each row's adapter for the experts'
// adapters; null: adapter 0). poll() runs after each grouped product; tokens_per_expert [E] +=
// the rows each expert ran on.
void experts_grouped(const backend::Ctx& ctx,
                     const ExpertViews& w,
                     ExpertAct act,
                     const RowSlots& slots,
                     const Tensor& in,  // [n, w]
                     Tensor& out,       // [n, w]
                     const std::function<void()>& poll,
                     std::vector<int64_t>& tokens_per_expert);

}  // namespace hymoe::model::detail
