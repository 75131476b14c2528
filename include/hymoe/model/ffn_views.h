// The MLP's weights as tensor views on any one device, and dense_ffn_forward over them
// (model/ffn.h's overload on DenseFfnWeights takes the host Buffers and calls this one): the same
// code runs on the CPU and, with every view a device tensor, on a CUDA Ctx (the GPU model's dense
// layers and shared experts, in its compute dtype). Views keep the weight list's shapes.
// Invariant: every tensor of one call lives on ctx.device; host adapters (LoraSlots) run on CPU
// contexts, factor views (lora_views.h) on any.
#pragma once

#include <vector>

#include "hymoe/backend/ctx.h"
#include "hymoe/model/config.h"
#include "hymoe/model/ffn.h"
#include "hymoe/model/lora_views.h"
#include "hymoe/tensor/tensor.h"

namespace hymoe::model {

// Adapters as factor views on gate, up, down.
struct MlpLoraViews {
    LoraSlotView gate, up, down;
};

struct DenseFfnViews {
    Tensor gate_proj;                 // [I, w] (empty for relu2)
    Tensor up_proj;                   // [I, w]
    Tensor down_proj;                 // [w, I]
    const LoraSlots* lora = nullptr;  // host adapters on gate, up, down; null: none
    MlpLoraViews lora_views;          // adapters as factor views on gate, up, down
};
DenseFfnViews ffn_views(const DenseFfnWeights& w);

// dense_ffn_forward (model/ffn.h) on views: y [n_tok, w] = down(act(x)) for x [n_tok, w]; the
// intermediate activations in x's dtype, y in its own (f32, or x's). rows (null: adapter 0 on
// every row) for the host adapters; lora_rows (null: none) each adapter's rows for the factor
// views.
void dense_ffn_forward(const backend::Ctx& ctx,
                       const DenseFfnViews& w,
                       ExpertAct act,
                       const Tensor& x /*[n_tok, w]*/,
                       Tensor& y /*[n_tok, w]*/,
                       const SeqBatch* rows = nullptr,
                       const std::vector<LoraRowsView>* lora_rows = nullptr);

// dense_ffn_backward (model/ffn.h) on views, f32 activations: dx [n_tok, w] (overwritten) for
// dy [n_tok, w], the hidden activations recomputed from x. The host adapters (w.lora, adapter 0 on
// every row; a CPU context only) and the factor views on their lora_rows (null: none; those with
// gradient views) accumulate (+=) their gradients, on either device (model/lora_views.h).
void dense_ffn_backward(const backend::Ctx& ctx,
                        const DenseFfnViews& w,
                        ExpertAct act,
                        const Tensor& x /*[n_tok, w]*/,
                        const Tensor& dy /*[n_tok, w]*/,
                        Tensor& dx /*[n_tok, w]*/,
                        const std::vector<LoraRowsView>* lora_rows = nullptr);

}  // namespace hymoe::model
