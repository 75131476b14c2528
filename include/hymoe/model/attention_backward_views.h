// The MLA/DSA/gated attention block's backward, and its training forward, on views over any Ctx
// (model/attention.h's attention_backward on MlaWeights calls this one): the same code on the CPU
// and, with every view a device tensor, on a CUDA Ctx (src/model/attention_backward.cpp,
// attention_sweep.cpp). Fresh sequences only (every pos0 = 0, no cache: the training case), in
// the expanded (MHA) form, per sequence, query block and head through ops on the Ctx
// (backend/ops_strided.h). Host adapters (w.lora) run on CPU contexts; factor views (w.lora_views
// on w.lora_rows, model/lora_views.h) on either, their gradient views accumulated (+=).
#pragma once

#include "hymoe/model/attention_views.h"

namespace hymoe::model {

// One call's batch of fresh sequences: the host SeqBatch (its sequences drive the sweep; checks;
// host adapters) and each row's position on ctx's device (i64 [n_tok], row t of sequence s at
// t − offsets[s]; empty: built from batch and uploaded).
struct AttnBatchViews {
    const SeqBatch* batch = nullptr;
    Tensor pos;
};

// attention_backward (model/attention.h) on views: dx [n_tok, d] (overwritten) for dy [n_tok, d],
// the forward recomputed from x [n_tok, d]; DSA's top-k a constant, the indexer without gradient.
void attention_backward(const backend::Ctx& ctx,
                        const ModelConfig& cfg,
                        const LayerSpec& spec,  // mixer mla or dsa, gated or not
                        const MlaWeightViews& w,
                        const Tensor& x,  // [n_tok, d]
                        const AttnBatchViews& b,
                        const Tensor& dy,                 // [n_tok, d]
                        Tensor& dx,                       // [n_tok, d]
                        const comm::Comm* tp = nullptr);  // as attention_forward's

// The training forward of the same sequences: y [n_tok, d] from x [n_tok, d], the expanded form
// attention_backward recomputes (equal to attention_forward's to fp32 rounding). attention_forward
// on views takes this path on a device context given no cache and no DeviceAttnRows.
void attention_forward(const backend::Ctx& ctx,
                       const ModelConfig& cfg,
                       const LayerSpec& spec,
                       const MlaWeightViews& w,
                       const Tensor& x,  // [n_tok, d]
                       const AttnBatchViews& b,
                       Tensor& y,  // [n_tok, d]
                       const comm::Comm* tp = nullptr);

}  // namespace hymoe::model
