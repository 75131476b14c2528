// LoRA adapters on the GPU model (model/device_model.h set_lora_adapters): the factors of every
// adapter on every adapted projection, uploaded once in fp32 (they are small, r × (in + out) a
// projection, and fp32 keeps the adapter's share as the CPU computes it in either compute dtype),
// and the step's rows per adapter (model/lora_rows.h). For each adapted projection and each
// adapter present, the adapter's rows are gathered, t = x Aᵀ [m, r] and y += s · t Bᵀ run as two
// fp32 GEMMs, and the rows scattered back: one GEMM pair per (adapter, projection), or per
// (expert, adapter, projection) for the routed experts, whose layers then route on the host.
// CUDA builds only (src/model/cuda/).
#pragma once

#include <cstdint>
#include <vector>

#include "hymoe/model/ffn_views.h"
#include "hymoe/model/lora_rows.h"
#include "hymoe/model/lora_views.h"
#include "hymoe/tensor/tensor.h"

namespace hymoe::model {
struct LayerWeights;
struct LayerViews;
struct LoraSlot;
}  // namespace hymoe::model

namespace hymoe::model::gpu {

struct Gpu;
class Scratch;
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
// so at ep > 1 the rank's hosted ones), as lora_views in permanent arena memory. Returns the most
// adapters a slot holds.
int upload_layer_lora(Gpu& g, const LayerWeights& host, LayerViews& w, MoeW& moe);

// The segments of r as device row lists (its rows uploaded once, in s), [n_groups] by group.
std::vector<std::vector<AdapterRowsW>> upload_lora_rows(Gpu& g,
                                                        Scratch& s,
                                                        const LoraRows& r,
                                                        int64_t n_groups);

// For each adapter of `rows` that slot holds: y [n, w] columns [y_col0, y_col0 + n_out) of its
// rows += s · (x [n, in] rows) Aᵀ (B rows [b_row0, b_row0 + n_out))ᵀ, in fp32 whatever x's and
// y's dtypes (f32 or bf16; y rounded back once). n_out < 0: B's rows from b_row0 on.
void lora_apply(Gpu& g,
                const LoraSlotW& slot,
                const std::vector<AdapterRowsW>& rows,
                const Tensor& x,
                Tensor& y,
                int64_t y_col0 = 0,
                int64_t b_row0 = 0,
                int64_t n_out = -1);

}  // namespace hymoe::model::gpu
