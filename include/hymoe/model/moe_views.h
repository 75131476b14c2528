// An MoE layer's weights as tensor views on one device, for moe_forward_parallel on a Ctx
// (model/moe_parallel.h): the CPU builds them from the host MoeWeights (moe_views), the GPU model
// from its device copies (src/model/device/device_runtime.h MoeW). Views keep the weight list's
// shapes; the routing's host side (correction bias, placement) stays on the host.
// Invariant: every tensor view lives on the Ctx's device, host_bias on the host.
#pragma once

#include <vector>

#include "hymoe/model/ffn.h"
#include "hymoe/model/ffn_views.h"
#include "hymoe/tensor/tensor.h"

namespace hymoe::model {

// The routed experts' matrices, one entry per expert slot (entries of experts not held: empty).
// On CUDA each list must be the slices of one stacked [E_held, ·, ·] tensor (ops::grouped_linear).
struct MoeExpertViews {
    std::vector<Tensor> gate;              // [slots] of [I, w] (swiglu)
    std::vector<Tensor> up;                // [slots] of [I, w]
    std::vector<Tensor> down;              // [slots] of [w, I]
    std::vector<const LoraSlots*> lora;    // [slots] host adapters (CPU); empty: none
    std::vector<MlpLoraViews> lora_views;  // [slots] factor-view adapters; empty: none
};

struct MoeWeightViews {
    Tensor router;           // [E, d] f32 (routing is fp32)
    Tensor bias;             // [E] f32 correction bias on the device (correction_bias)
    Tensor fc1;              // [ℓ, d] (latent_moe)
    Tensor fc2;              // [d, ℓ] (latent_moe)
    MoeExpertViews experts;  // the routed experts
    DenseFfnViews shared;    // the shared experts (n_shared_experts > 0)
    // Host side: the routing's bias and the placement of the experts (MoeWeights::expert_rank).
    Tensor host_bias;              // [E] f32 on the host (empty: no correction bias)
    std::vector<int> expert_rank;  // [E] ep rank hosting each expert (empty: blocks of E/ep)
    std::vector<int> expert_slot;  // [E] entry of expert e in `experts` (−1: not held); empty:
                                   //   e itself (the lists are [E])
    DType act = DType::f32;        // dtype of the experts' and shared experts' inputs
};

// The CPU's views of host weights: lists [E], activations f32.
MoeWeightViews moe_views(const MoeWeights& w);

}  // namespace hymoe::model
