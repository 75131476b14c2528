// FFN blocks (spec/model-math.md §6-7): the dense SwiGLU MLP, the routed MoE (router, capacity
// dropping, experts, combine) with shared experts, and LatentMoE (experts in a down-projected
// latent of width ℓ). CPU reference, fp32 throughout: router logits, scores, weights, expert
// activations and the combine (model-math §10).
// Invariants: routing is a pure function of (x_t, weights, config) per token, except capacity
// dropping, which looks at every token of the call; the router computes its logits one token at a
// time, so a token's expert choice is the same bit for bit whatever shares its call. The expert,
// latent and shared products are batched GEMMs, and the combine adds a token's expert outputs in
// its top-k slot order: the output never depends on the expert processing order, and it agrees
// across token orders and batchings to BLAS rounding (~1e-6).
#pragma once

#include <cstdint>
#include <vector>

#include "hymoe/backend/ctx.h"
#include "hymoe/model/config.h"
#include "hymoe/model/lora.h"
#include "hymoe/model/weights.h"
#include "hymoe/tensor/tensor.h"

namespace hymoe::model {

// One SwiGLU (or relu2) MLP: a dense layer, one routed expert, or the shared experts. Width I,
// input width w (d, or ℓ for latent experts). relu2 experts have no gate_proj.
struct DenseFfnWeights {
    Buffer gate_proj;  // [I, w]  (HF gate_proj / Kimi w1; empty for relu2)
    Buffer up_proj;    // [I, w]  (HF up_proj / Kimi w3)
    Buffer down_proj;  // [w, I]  (HF down_proj / Kimi w2)
    LoraSlots lora;    // adapters on gate, up, down (adapter 0 on every row); none by default
};

struct MoeWeights {
    Buffer gate;                           // [E, d]  router gate.weight (runs on the full x)
    Buffer correction_bias;                // [E]     e_score_correction_bias (selection only);
                                           //         empty unless MoeConfig::correction_bias
    std::vector<DenseFfnWeights> experts;  // [E] experts of width moe_intermediate on d (moe)
                                           //     or ℓ (latent_moe)
    DenseFfnWeights shared;                // width shared_intermediate on the full x; empty
                                           // when n_shared_experts = 0
    Buffer fc1_latent_proj;                // [ℓ, d]  latent_moe only: z = x fc1ᵀ
    Buffer fc2_latent_proj;                // [d, ℓ]  latent_moe only: y = y_lat fc2ᵀ
    std::vector<int> expert_rank;          // [E] under ep: the ep rank hosting each routed
                                           //     expert (model/eplb.h); empty: rank e/(E/ep)
};

// The tensors of one layer's FFN, named relative to its prefix ("model.layers.{i}.mlp." or
// "model.layers.{i}.block_sparse_moe."), with the names of cfg.model_type's family:
//   dense:             gate_proj.weight, up_proj.weight, down_proj.weight
//   moe (kimi_linear): gate.weight, gate.e_score_correction_bias, experts.{e}.{w1,w3,w2}.weight,
//                      shared_experts.{gate_proj,up_proj,down_proj}.weight
//   moe (others):      the same with experts.{e}.{gate_proj,up_proj,down_proj}.weight
//   latent_moe:        the moe names + fc1_latent_proj.weight, fc2_latent_proj.weight
// relu2 experts list no gate matrix. `dense` is filled for Ffn::dense layers, `moe` otherwise
// (the other may be null; both null: the shapes alone, model/tensor_list.h, with the hosted routed
// experts' matrices stacked, "experts.*." and TensorSpec::count). Init: normal (std 0.02), the
// correction bias Init::small_bias. Under model parallelism (model/shard.h) cfg is the rank's
// local config: the dense and shared widths are cut over tp, the routed expert width over etp, and
// only the `hosted` experts are listed (moe->experts keeps all E slots; the others stay empty).
// The router is whole.
TensorList ffn_tensors(const ModelConfig& cfg,
                       const LayerSpec& spec,
                       DenseFfnWeights* dense,
                       MoeWeights* moe,
                       const std::vector<int>* hosted = nullptr);  // null: all E
// The matrices of the routed experts `experts` alone (named as in ffn_tensors), for moving
// experts between ranks (model/eplb.h).
TensorList routed_expert_tensors(const ModelConfig& cfg,
                                 const LayerSpec& spec,
                                 MoeWeights& moe,
                                 const std::vector<int>& experts);

// y [n_tok, w] = down(act(x)) for one MLP on x [n_tok, w], on ctx's device (backend-neutral ops):
//   swiglu: down(SiLU(gate x) ⊙ up x),  relu2: down(ReLU(up x)²).
// rows names each row's adapter (its sequences are runs of rows, model/lora.h); null: adapter 0
// on every row. The host slots (w's LoraSlots) run on CPU contexts; on a device, adapters are
// factor views (model/ffn_views.h).
void dense_ffn_forward(const backend::Ctx& ctx,
                       const DenseFfnWeights& w,
                       ExpertAct act,
                       const Tensor& x /*[n_tok, w]*/,
                       Tensor& y /*[n_tok, w]*/,
                       const SeqBatch* rows = nullptr);

// Backward of dense_ffn_forward: dx [n_tok, w] is overwritten with ∂L/∂x from dy [n_tok, w];
// the adapters in w.lora accumulate their gradients.
void dense_ffn_backward(const DenseFfnWeights& w,
                        ExpertAct act,
                        const Tensor& x,   // [n_tok, w]
                        const Tensor& dy,  // [n_tok, w]
                        Tensor& dx);       // [n_tok, w]

// The router's decision for n_tok tokens. Slot i of a token is its i-th best expert.
struct Routing {
    std::vector<int64_t> idx;                // [n_tok, top_k] expert ids, best first
    std::vector<float> weight;               // [n_tok, top_k] combine weights incl. ρ;
                                             //   0 for dropped assignments
    std::vector<uint8_t> kept;               // [n_tok, top_k] 1 = computed, 0 = dropped by
                                             //   capacity (weight 0, expert not run)
    std::vector<int64_t> tokens_per_expert;  // [E] assignments computed, after dropping
    int64_t dropped = 0;                     // assignments dropped by capacity
};

// Router of model-math §6 on x [n_tok, d] (the full-width x, also for latent_moe):
//   s = σ(x Wᵍᵀ) or softmax(x Wᵍᵀ) (fp32), s' = s + b (selection only; b = 0 without bias);
//   group-limited when n_group > 1: group score = sum of its top-2 s' (max s' without bias),
//   keep the topk_group best groups, mask the rest (−inf; kimi_linear: 0.0, as its HF file);
//   idx = top-k of s' (ties → smaller id); w = s[idx] (s'[idx] when weights_from_biased_scores);
//   renormalize: w /= Σw (+1e-20 and only for top_k > 1 on kimi_linear); w ×= ρ.
// Capacity (capacity_factor > 0): C = ceil(n_tok·top_k/E · CF); each expert keeps the C
// assignments with the largest weight (drop_policy probs; equal weights → earlier token) or of
// the earliest tokens (position); the rest are dropped.
Routing route(const ModelConfig& cfg, const MoeWeights& w, const Tensor& x /*[n_tok, d]*/);

// The MoE layer on one rank: moe_forward_parallel (model/moe_parallel.h) with groups of one, the
// only MoE forward. y [n_tok, d] = Σ_i w_i · Expert_idx_i(x) + Shared(x) for x [n_tok, d] (moe), or
// y = fc2(Σ_i w_i · Expert_idx_i(fc1 x)) + Shared(x) (latent_moe). y must not alias x. Each
// expert runs on its kept tokens in token order, one row at a time; the weighted sum is
// accumulated in fp32 in each token's slot order. routing_out, when given, receives the routing.
// rows (null: adapter 0 everywhere) names each token's adapter for the experts' and shared
// experts' adapters: a routed expert applies the adapter of each token it computes.
void moe_forward(const ModelConfig& cfg,
                 const LayerSpec& spec,
                 const MoeWeights& w,
                 const Tensor& x /*[n_tok, d]*/,
                 Tensor& y /*[n_tok, d]*/,
                 Routing* routing_out = nullptr,
                 const SeqBatch* rows = nullptr);

// Backward of moe_forward on one rank, moe_backward_parallel with groups of one (spec/model-math.md
// §9): the routing (expert choice and
// capacity drops) is recomputed and held constant; the gradient flows through the experts, the
// shared experts, the latent projections (latent_moe) and the combine weights into the router
// logits (the correction bias has none). dx [n_tok, d] is overwritten; the experts' and shared
// experts' adapters accumulate their gradients.
void moe_backward(const ModelConfig& cfg,
                  const LayerSpec& spec,
                  const MoeWeights& w,
                  const Tensor& x,   // [n_tok, d]
                  const Tensor& dy,  // [n_tok, d]
                  Tensor& dx);       // [n_tok, d]

}  // namespace hymoe::model
