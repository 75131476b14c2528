// The LoRA adapters of a whole model (spec/model-math.md §9): which projections carry adapters
// (deck finetune.lora.target_modules), their PEFT module names, shapes and tensor-parallel cuts,
// and the slots the blocks read. Targets:
//   q_proj, k_proj, v_proj, o_proj  the matching projections of every mixer: KDA q/k/v/o_proj;
//                                   MLA/DSA q_proj (q_b_proj with a query latent), k_proj or
//                                   v_proj → kv_a_proj_with_mqa (one adapter), o_proj
//   gate_proj, up_proj, down_proj   the dense FFNs' and the shared experts' projections
//   experts                         every routed expert's three projections: one adapter per
//                                   layer shared by its experts, or one per expert (per_expert)
//   shared_experts                  the shared experts' three projections
// An adapter's factors are cut like its weight: a weight split along its output rows (dim 0)
// splits B's rows and keeps A whole; one split along its input (dim 1) splits A's columns and
// keeps B whole. So the blocks' tp reductions carry the adapters' shares too, and the whole
// factor is the same on every layout (random init draws it whole from its own stream).
#pragma once

#include <deque>
#include <string>
#include <vector>

#include "hymoe/model/model.h"

namespace hymoe::model {

// One adapted projection.
struct LoraModule {
    std::string name;                     // module path, "model.layers.3.self_attn.q_proj";
                                          //   "model.layers.5.mlp.experts.gate_proj" for a
                                          //   layer-shared expert adapter
    std::vector<std::string> peft_names;  // the module paths it stands for in a PEFT file (a
                                          //   shared expert adapter: one per routed expert)
    LoraSlot* slot = nullptr;
    TensorSpec weight;             // the adapted weight (local shape, split), or the first
                                   //   hosted expert's of a shared expert adapter
    std::vector<Buffer*> adapted;  // every weight it adapts (a shared one: each hosted expert's)
    int layer = -1;
    bool expert = false;  // a routed-expert adapter (cut over etp; gradients summed over edp)
};

class LoraModel {
public:
    std::vector<LoraModule> modules;
    // Every pair of adapter `a` as named tensors, "<module>.lora_A.weight" [r, in] and
    // "<module>.lora_B.weight" [out, r], with their local shapes and splits (dest: the factor;
    // grad: pass true for dA/dB instead).
    TensorList tensors(int adapter, bool grads = false);
    LoraSlot& new_slot() { return slots_.emplace_back(); }

private:
    std::deque<LoraSlot> slots_;  // stable addresses: the blocks hold pointers
};

// Builds the slots for `targets` on this rank's layers and hooks them into m's blocks (no
// adapters yet). With every_target, throws Exit::invalid naming finetune.lora.target_modules
// when a target matches no projection of the model on this rank's layers.
LoraModel attach_lora(Model& m,
                      const std::vector<std::string>& targets,
                      bool per_expert,
                      bool every_target = true);

// Appends adapter id slot.adapters.size() to every slot: rank r, scale s; A Kaiming-uniform
// drawn whole per module from (seed, its name) and cut to this rank's part, B zero; with
// gradient buffers when trainable.
void add_lora_adapter(
    LoraModel& lm, const ModelShard& shard, int rank, float scale, uint64_t seed, bool trainable);

// Trainable parameters of adapter 0 on this rank (its local factors).
int64_t lora_local_params(LoraModel& lm);

// W += s·B A of adapter `adapter` on every adapted weight (the merged weights); then every slot
// is emptied, so the blocks run the merged weights alone.
void merge_lora(LoraModel& lm, int adapter);

}  // namespace hymoe::model
