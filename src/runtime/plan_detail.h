// Private to src/runtime/plan*.cpp: what the weights (plan_weights.cpp), the memory
// (plan_memory.cpp), the step cost and time model (plan_comm.cpp) and the assembly of a plan
// (plan.cpp) share: the blocks' weight shapes, the context every formula reads, and the per-stage
// functions make_plan calls. Every rule used here is stated in runtime/plan.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "hymoe/deck/deck.h"
#include "hymoe/model/config.h"
#include "hymoe/model/tensor_list.h"
#include "hymoe/parallel/grid.h"
#include "hymoe/runtime/plan.h"

namespace hymoe::runtime::detail {

using i64 = int64_t;
using model::ExpertAct;
using model::Ffn;
using model::LayerSpec;
using model::Mixer;
using model::ModelConfig;

constexpr double kF32 = 4;  // fp32 bytes

inline size_t idx(PlanBlock b) {
    return static_cast<size_t>(b);
}
inline size_t idx(PlanPhase p) {
    return static_cast<size_t>(p);
}

// ---- weights (plan_weights.cpp) -----------------------------------------------------------------

// Intermediate tensors of one MLP row: swiglu gate, up, product; relu2 up, square.
inline int mlp_tensors(ExpertAct act) {
    return act == ExpertAct::swiglu ? 3 : 2;
}

inline bool is_attention(Mixer m) {
    return m == Mixer::mla || m == Mixer::dsa;
}

// Width the routed experts run at: d, or ℓ for latent MoE.
inline i64 expert_width(const ModelConfig& m, const LayerSpec& s) {
    return s.ffn == Ffn::latent_moe ? m.moe.latent_size : m.hidden_size;
}

// LoRA parameters of one rank: A [r, in] and B [out, r] on each targeted matrix. A column-parallel
// matrix (out split over tp) keeps A whole and splits B; a row-parallel one (o_proj, down_proj)
// splits A and keeps B; a replicated one keeps both. Targets: KDA q/k/v/o_proj; MLA q_proj → wq_b
// (q_proj without a query latent), k_proj → wkv_a, v_proj → wkv_b, o_proj; dense FFN and shared
// experts gate/up/down_proj (shared_experts: all three); experts: every routed expert matrix, one
// adapter per layer shared by its experts unless expert_adapters: per_expert.
struct LoraCount {
    i64 dense = 0;   // all-reduced over dp
    i64 expert = 0;  // all-reduced over edp (per expert) or ep·edp (shared adapter)
};

LoraCount lora_params(const ModelConfig& m,
                      const parallel::Layout& l,
                      const deck::LoraSection& lora,
                      int first,
                      int n_layer);

// One layer's weights on one rank of its stage, by block, and what the step model reads of its MoE.
struct LayerParams {
    std::array<i64, kPlanBlocks> params{};
    i64 f32 = 0;          // of them, those held in fp32 at any model.dtype (StagePlan::f32_params)
    i64 expert = 0;       // one routed expert's part (1/etp of its matrices)
    i64 router_gate = 0;  // the gate [E, d] alone (the correction bias only shifts the scores)
};

// Each kind of layer's weights under one layout's cut (described once for all its stages).
using LayerKinds = std::vector<std::pair<LayerSpec, LayerParams>>;

// The weights one rank of stage `sp` holds, by block (sp.params) and in fp32 (sp.f32_params), and
// the stage's layers by kind: the weight list of its shard summed; per layer of the stage.
std::vector<LayerParams> stage_weights(const ModelConfig& m,
                                       const parallel::Layout& l,
                                       StagePlan& sp,
                                       LayerKinds& kinds);

// Every weight once, by block; and the weights one text token uses (count_params' active).
void model_weights(const ModelConfig& m, Plan& plan);

// ---- the context every formula reads ------------------------------------------------------------

struct Ctx {
    const ModelConfig& m;
    const parallel::Layout& l;
    const PlanWorkload& w;
    const deck::HardwareSection& hw;
    double b = 2;  // bytes of model.dtype
    double u = 1;  // ep ranks a token's experts are spread over
    // shorthands
    double d() const { return m.hidden_size; }
    double tp() const { return l.tp; }
};

// ---- memory (plan_memory.cpp) -------------------------------------------------------------------

// Cache bytes per token of one attention layer: latent c_kv + rope key k_r (+ DSA index key),
// in the KV dtype.
double kv_per_token(const Ctx& x, const LayerSpec& s);

// One sequence's KDA state in one layer: fp32 S [H/tp, K, V] + conv tails 3 × [W−1, D/tp] fp32.
double kda_state_bytes(const Ctx& x);

// Keys a query attends to: the top-k of DSA, else the whole context.
double attended(const Ctx& x, const LayerSpec& s, double c);

// The memory of one rank of stage `sp` (sp.mem), from its weights and LoRA parameters.
void stage_memory(const Ctx& x, StagePlan& sp);

// ---- step cost and time (plan_comm.cpp) ---------------------------------------------------------

// u = ep·(1 − C(E − E/ep, k)/C(E, k)): the expected number of distinct ep ranks among a token's
// top-k experts when the k experts are a uniform random k-subset of E.
double experts_reached(const ModelConfig& m, const parallel::Layout& l);

// Forward FLOPs of one text token through the whole model at attention context c: 2 per weight
// it uses (the embedding lookup is free) + attention: MLA/DSA scores and values over the context
// (DSA: its top-k), indexer scores over the whole context, the KDA recurrence 8·H·K·V.
double flops_per_token(const ModelConfig& m, const Plan& plan, double c);

// A group of `size` ranks `stride` apart lies in one node when stride·size ≤ gpus_per_node.
double group_bandwidth(const deck::HardwareSection& hw, i64 stride, i64 size);

// Ring all-reduce: each rank sends 2(n−1)/n of the buffer.
double ring(i64 n, double bytes);

// The kind of step stage_step models, and its micro-batch.
enum class StepKind { prefill, decode, train };

struct StepShape {
    StepKind kind = StepKind::prefill;
    double n = 0;       // tokens of the micro-batch per dp replica
    double seqs = 1;    // sequences among them
    double c = 0;       // attention context (average, for timing)
    double logits = 0;  // rows of logits the last stage computes
};

// The step's total, max(compute, hbm) + tp + ep + pp + dp, and its dominant phase.
void finish_step(StepPlan& sc);

// One micro-batch of `sh` through stage `sp` (its layers' weights: stage_weights) on one rank:
// FLOPs, HBM bytes, comm bytes, seconds.
StepPlan stage_step(const Ctx& x,
                    const StagePlan& sp,
                    const std::vector<LayerParams>& layers,
                    const StepShape& sh);

}  // namespace hymoe::runtime::detail
