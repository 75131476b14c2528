// LoRA adapters on the model on a device (model/device_model.h set_lora_adapters): the factors of
// every adapter on every adapted projection, uploaded once in fp32 (they are small, r × (in + out)
// a projection, and fp32 keeps the adapter's share as the CPU computes it in either compute
// dtype), and the step's rows per adapter (model/lora_rows.h), which the blocks' ops::lora calls
// read (backend/ops_lora.h: each adapter's rows gathered, two fp32 GEMMs, the rows added back).
#pragma once

#include <cstdint>
#include <vector>

#include "hymoe/backend/ctx.h"
#include "hymoe/backend/held.h"
#include "hymoe/model/ffn_views.h"
#include "hymoe/model/lora_rows.h"
#include "hymoe/model/lora_views.h"
#include "hymoe/tensor/tensor.h"

namespace hymoe::model {
struct LayerWeights;
struct LayerViews;
struct LoraSlot;
}  // namespace hymoe::model

namespace hymoe::model::dev {

struct MoeW;

// The adapters as factor views on the device (model/lora_views.h): one adapter on one projection
// (A empty: it leaves it alone), a projection's adapters by id, a mixer's by projection.
using LoraW = LoraFactorsView;
using LoraSlotW = LoraSlotView;
using MixerLoraW = MixerLoraViews;

using MlpLoraW = MlpLoraViews;

// One adapter's rows in a step, or in an expert-grouped buffer (i64 [m] on the device).
using AdapterRowsW = LoraRowsView;

// The step's adapters (StepBatch::lora); no rows: the step uses none.
struct LoraStep {
    int n_adapters = 0;              // adapters the model holds
    std::vector<AdapterRowsW> rows;  // each adapter the step's rows use, its rows
    std::vector<int> row_adapter;    // [n_tok] on the host: every row's adapter (with rows)
};

// The adapters hooked into host's blocks for layer `host` into its views w (kda, mla, dense) and
// its MoE's moe (shared and routed experts: one entry per held expert, as moe's stacked experts,
// so at ep > 1 the rank's hosted ones), as lora_views of tensors kept in keep. Returns the most
// adapters a slot holds.
int upload_layer_lora(const backend::Ctx& ctx,
                      std::vector<backend::Held>& keep,
                      const LayerWeights& host,
                      LayerViews& w,
                      MoeW& moe);

// The segments of r as device row lists (its rows uploaded once, in s, from a host copy that
// staged keeps: device_runtime.h upload_values), [n_groups] by group.
std::vector<std::vector<AdapterRowsW>> upload_lora_rows(const backend::Ctx& ctx,
                                                        backend::Scratch& s,
                                                        std::vector<Buffer>& staged,
                                                        const LoraRows& r,
                                                        int64_t n_groups);

}  // namespace hymoe::model::dev
