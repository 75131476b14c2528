// The KDA block's weights and per-sequence states as tensor views on any one device, and the
// forward over them (model/kda.h's kda_forward takes the host Buffers and calls this one): the
// same code runs on the CPU and, with every view a device tensor, on a CUDA Ctx. Views keep the
// shapes of the weight list (kda_tensors): conv taps [D, 1, W], A_log [1, 1, H, 1].
// Invariant: every tensor of one call lives on ctx.device; LoRA adapters (host) run on the CPU
// only.
#pragma once

#include <vector>

#include "hymoe/model/kda.h"

namespace hymoe::model {

struct KdaWeightViews {
    Tensor q_proj, k_proj, v_proj;        // [D, d]
    Tensor q_conv1d, k_conv1d, v_conv1d;  // [D, 1, W]
    Tensor f_a_proj;                      // [K, d]
    Tensor f_b_proj;                      // [D, K]
    Tensor dt_bias;                       // [D]
    Tensor a_log;                         // [1, 1, H, 1]
    Tensor b_proj;                        // [H, d]
    Tensor g_a_proj;                      // [K, d]
    Tensor g_b_proj;                      // [D, K]
    Tensor o_norm;                        // [K]
    Tensor o_proj;                        // [d, D]
    const LoraSlots* lora = nullptr;      // adapters on q, k, v, o; null: none
};
KdaWeightViews kda_views(const KdaWeights& w);

struct KdaStateViews {
    Tensor S;                       // [H, K, V] fp32
    Tensor q_tail, k_tail, v_tail;  // [W−1, D]
};
KdaStateViews kda_views(KdaState& st);

// kda_forward (model/kda.h) on views: y [n_tok, d] from x [n_tok, d]; states[s] continued in place.
void kda_forward(const backend::Ctx& ctx,
                 const ModelConfig& cfg,
                 const KdaWeightViews& w,
                 const Tensor& x,
                 const SeqBatch& batch,
                 const std::vector<KdaStateViews>& states,  // [n_seq]
                 Tensor& y,
                 KdaMode mode = KdaMode::automatic);

}  // namespace hymoe::model
