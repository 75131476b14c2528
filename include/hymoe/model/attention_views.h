// The MLA/DSA block's weights as tensor views on any one device, and the forward over them
// (model/attention.h's attention_forward takes the host Buffers and calls this one). Views keep
// the shapes of the weight list (attention_tensors); absent weights (q_proj under a query latent,
// g_proj without a gate, the indexer of an MLA layer) are empty views.
// Invariant: every tensor of one call lives on ctx.device; host LoRA adapters (lora) run on the
// CPU only, factor views (lora_views on lora_rows, model/lora_views.h) on either device, each
// site through model::lora_forward as kda_forward's. Every step is an op on the Ctx: the
// projections, norms, RoPE, the indexer's projections, the cache append and the attention over
// it (backend/ops_mla.h), the gate and the output projection. A CUDA Ctx takes its pages and its
// rows' metadata on the device from a DeviceAttnRows (the GPU model's step; a CPU Ctx takes one
// too, which tests/unit/model/test_attention_device_rows.cpp holds to the host caches); without
// one and without caches (training: fresh sequences) it runs the expanded form of
// model/attention_backward_views.h instead.
#pragma once

#include <vector>

#include "hymoe/backend/latent_cache.h"
#include "hymoe/backend/ops_mla.h"
#include "hymoe/model/attention.h"
#include "hymoe/model/lora_views.h"

namespace hymoe::model {

struct IndexerWeightViews {
    Tensor wq_b;           // [H_I·d_I, r_q]
    Tensor wk;             // [d_I, d]
    Tensor k_norm_weight;  // [d_I]
    Tensor k_norm_bias;    // [d_I]
    Tensor weights_proj;   // [H_I, d]
};

struct MlaWeightViews {
    Tensor q_a_proj;            // [r_q, d]
    Tensor q_a_layernorm;       // [r_q]
    Tensor q_b_proj;            // [H·(d_n+d_r), r_q]
    Tensor q_proj;              // [H·(d_n+d_r), d]
    Tensor kv_a_proj_with_mqa;  // [r_kv+d_r, d]
    Tensor kv_a_layernorm;      // [r_kv]
    Tensor kv_b_proj;           // [H·(d_n+d_v), r_kv]
    Tensor o_proj;              // [d, H·d_v]
    Tensor g_proj;              // [H·d_v, d]
    IndexerWeightViews indexer;
    // Adapters on q (q_proj or q_b_proj), kv (kv_a_proj_with_mqa: onto [c_kv | k_r] before the
    // split, B [r_kv + d_r, r]) and o, as host slots (null: none) and as factor views on the
    // call's rows of each adapter (lora_rows; null: none); k and v stay empty.
    const LoraSlots* lora = nullptr;
    MixerLoraViews lora_views;
    const std::vector<LoraRowsView>* lora_rows = nullptr;
};
MlaWeightViews attention_views(const MlaWeights& w);

// A call's rows on its Ctx's device (the GPU model's step), for attention_forward: the positions
// are not uploaded and the caches not touched (the caller counts their tokens).
struct DeviceAttnRows {
    backend::LatentCache pages;  // the layer's device pages, block-table row s = sequence s
    Tensor pos;                  // i64 [n_tok] each row's position
    Tensor row_seq;              // i32 [n_tok] each row's sequence
    ops::MlaDeviceRows rows;     // the decode rows and the fused DSA plans
};

// attention_forward (model/attention.h) on views; dev: a device step's rows (caches then empty).
void attention_forward(const backend::Ctx& ctx,
                       const ModelConfig& cfg,
                       const LayerSpec& spec,
                       const MlaWeightViews& w,
                       const Tensor& x,                        // [n_tok, d]
                       const SeqBatch& batch,                  // n_seq sequences over the rows
                       const std::vector<AttnCache*>& caches,  // [n_seq] or empty
                       Tensor& y,                              // [n_tok, d]
                       AttnMode mode = AttnMode::automatic,
                       AttnStats* stats = nullptr,
                       const comm::Comm* tp = nullptr,
                       const DeviceAttnRows* dev = nullptr);

// The indexer's inputs (IndexerInputs) of the new tokens on ctx: q, k, w [n_tok, ·] written in
// place, from x [n_tok, d], c_q [n_tok, r_q] and pos [n_tok] int64, all on ctx's device.
void indexer_project(const backend::Ctx& ctx,
                     const ModelConfig& cfg,
                     const IndexerWeightViews& w,
                     const Tensor& x,
                     const Tensor& c_q,
                     const Tensor& pos,
                     Tensor& q,       // [n_tok, H_I·d_I]
                     Tensor& k,       // [n_tok, d_I]
                     Tensor& w_out);  // [n_tok, H_I]

// attention_backward (model/attention.h) on a Ctx over the host weights: the views form
// (model/attention_backward_views.h) on attention_views(w), positions built from the batch.
void attention_backward(const backend::Ctx& ctx,
                        const ModelConfig& cfg,
                        const LayerSpec& spec,
                        const MlaWeights& w,
                        const Tensor& x,  // [n_tok, d]
                        const SeqBatch& batch,
                        const Tensor& dy,  // [n_tok, d]
                        Tensor& dx,        // [n_tok, d]
                        const comm::Comm* tp = nullptr);

}  // namespace hymoe::model
