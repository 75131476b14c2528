// The model's weights as tensor views on any one device, built by one builder from the weight
// list (model/tensor_list.h): every tensor model_tensors names is looked up by its full HF name in
// a NamedTensors (the host Buffers' views on the CPU, the uploaded device tensors on the GPU),
// checked against the list's shape, and handed to the blocks' views (kda_views.h,
// attention_views.h, ffn_views.h). No shape or name is written out here: the list is the one
// description. The vision tower is not among the views (model/vision.h holds and runs it).
// Views do not own memory: they live as long as the tensors looked up.
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

#include "hymoe/model/attention_views.h"
#include "hymoe/model/ffn_views.h"
#include "hymoe/model/kda_views.h"
#include "hymoe/model/moe_views.h"
#include "hymoe/model/weights.h"
#include "hymoe/tensor/tensor.h"

namespace hymoe::model {

struct Model;

// Tensors by full weight name ("model.layers.3.self_attn.q_proj.weight"), each at the shape the
// weight list gives it, all on one device.
using NamedTensors = std::unordered_map<std::string, Tensor>;

// One decoder layer's weights; only the mixer's and the FFN's of its LayerSpec are filled (the
// others stay empty views). Host adapters (the views' `lora`, the MoE experts' lora list) and the
// MoE's host-side bias are null or empty unless a caller sets them (host_views does);
// factor-view adapters (lora_views) are empty. The MoE's expert lists are [E] (experts this rank
// does not host: empty entries); where the walk stacked them (the GPU's upload), each list's
// entries are the slices of one [E_held, ·, ·] tensor, ids ascending.
struct LayerViews {
    Tensor attn_norm;     // [d] input_layernorm.weight
    Tensor ffn_norm;      // [d] post_attention_layernorm.weight
    KdaWeightViews kda;   // Mixer::kda
    MlaWeightViews mla;   // Mixer::mla, Mixer::dsa (indexer: dsa only; q_proj or q_a/q_b by r_q)
    DenseFfnViews dense;  // Ffn::dense
    MoeWeightViews moe;   // Ffn::moe, Ffn::latent_moe
};

struct ModelViews {
    Tensor embed;                    // [V/tp, d] first stage (and a tied head's last stage)
    Tensor final_norm;               // [d] last stage
    Tensor head;                     // [V/tp, d] last stage: lm_head, or embed when tied
    std::vector<LayerViews> layers;  // [n_layer], filled for the stage's layers only
};

// Where a walk that stacks the routed experts (the GPU's upload) puts each tensor of a bound list
// (model_tensors): a routed expert's matrix into slot `slot` of the stack named `stack` (its name
// with the expert's id as "*", the name the unbound weight_list gives the stack) of `size`
// experts, in list order (ids ascending); any other tensor: stack empty, a tensor of its own.
struct StackSlot {
    std::string stack;
    int64_t slot = 0;
    int64_t size = 1;
};
std::vector<StackSlot> expert_stacks(const TensorList& list);  // [list.size()]

// The views of m's part (its config, shard and expert placement: only m's shapes are read, not
// its weights) over `tensors`: every tensor of model_tensors(m) but the vision tower's, by name.
// A name the list gives that tensors lacks, a tensor without data or of another shape than the
// list's, fails (Exit::internal) naming it. Host adapters null.
ModelViews model_views(const Model& m, const NamedTensors& tensors);

// v (m's views, from model_views) with each MoE layer's host side of the routing taken from m:
// the correction bias on the host and the routed experts' placement (MoeWeightViews::host_bias,
// expert_rank), which model_views leaves out. m must outlive v.
void add_routing_host_side(ModelViews& v, const Model& m);

// The views of every tensor of model_tensors(m) on m's own Buffers, by name (weights not yet
// allocated: null data).
NamedTensors named_views(const Model& m);

// model_views(m, named_views(m)) with the host adapters of m's blocks (LoraSlots) set: the CPU's
// views, valid while m's weights are neither reallocated nor moved between buffers.
ModelViews host_views(const Model& m);

}  // namespace hymoe::model
