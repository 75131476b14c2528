// The MoE layer on the fused kernels (model/moe_parallel.h moe_runs_fused), the branch
// moe_forward_parallel takes where they apply: routing on the device (ops::moe_route), the routed
// experts in ops::moe_fused_experts, the shared experts by dense_ffn_forward. Private to src/model.
#pragma once

#include <vector>

#include "hymoe/backend/ctx.h"
#include "hymoe/model/config.h"
#include "hymoe/model/lora_views.h"
#include "hymoe/model/moe_parallel.h"
#include "hymoe/model/moe_views.h"
#include "hymoe/tensor/tensor.h"

namespace hymoe::model::detail {

// y [n, d] f32 = the layer's output on x [n, d] (moe_forward_parallel's contract at groups of
// one), for a layer moe_runs_fused takes; stats (null: none) get calls and, with load, the expert
// load. rows and lora_rows: the shared experts' adapters, as dense_ffn_forward's.
void moe_forward_fused(const backend::Ctx& ctx,
                       const ModelConfig& cfg,
                       const LayerSpec& spec,
                       const MoeWeightViews& local,
                       const Tensor& x /*[n, d]*/,
                       Tensor& y /*[n, d]*/,
                       bool load,
                       MoeCommStats* stats,
                       const SeqBatch* rows,
                       const std::vector<LoraRowsView>* lora_rows);

}  // namespace hymoe::model::detail
