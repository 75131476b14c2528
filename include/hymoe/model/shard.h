// How one rank's part of the model is cut from the whole (Megatron-Core's layout):
//   tp   attention (MLA/DSA), DSA indexer and KDA heads, the dense FFN and shared-expert widths,
//        and the vocabulary rows of the embedding and LM head are cut into tp contiguous parts
//        (the indexer's partial scores are all-reduced over tp before its top-k); the routers,
//        the latent projections, the indexer key projection and every norm stay whole;
//   ep   routed experts: rank ep_rank hosts experts [ep_rank·E/ep, (ep_rank+1)·E/ep), or where
//        a rebalanced placement puts them (model/eplb.h);
//   etp  each hosted expert's width is cut into etp parts (etp divides tp, so etp_rank is
//        tp_rank mod etp and an expert's parts sit in one tp group);
//   pp   stage s owns a contiguous run of layers (stage_starts); the embedding lives on the first
//        stage and the final norm and LM head on the last (a tied head: the embedding again).
// The blocks run unchanged on the local config (heads and widths divided) and the model adds the
// reductions (model.cpp). The cut is declared with each tensor (TensorSpec::split_dim), so random
// init draws the whole tensor from its own stream and keeps this rank's part: the weights are
// the same whatever the layout.
#pragma once

#include <vector>

#include "hymoe/model/config.h"
#include "hymoe/model/ffn.h"
#include "hymoe/parallel/grid.h"

namespace hymoe::model {

struct ModelShard {
    int tp = 1, tp_rank = 0;
    int etp = 1, etp_rank = 0;
    int ep = 1, ep_rank = 0;
    int pp = 1, stage = 0;
    int first_layer = 0, end_layer = 0;  // this stage's layers [first_layer, end_layer)
    bool first_stage() const { return stage == 0; }
    bool last_stage() const { return stage == pp - 1; }
    bool owns_layer(int i) const { return i >= first_layer && i < end_layer; }
    int parts(SplitOver over) const { return over == SplitOver::tp ? tp : etp; }
    int part(SplitOver over) const { return over == SplitOver::tp ? tp_rank : etp_rank; }
};

// First layer of every stage, then the layer count: the '|' boundaries of the layer pattern when
// they give pp stages, else a balanced split (stage s: layers ⌊s·L/pp⌋ .. ⌊(s+1)·L/pp⌋).
std::vector<int> stage_starts(const ModelConfig& cfg, int pp);

// The whole model on one rank.
ModelShard whole_model(const ModelConfig& cfg);
// The part of rank `me` under `layout` (already validated against cfg: runtime/job.h).
ModelShard make_shard(const ModelConfig& cfg,
                      const parallel::Layout& layout,
                      const parallel::Coords& me);
// cfg with the per-rank head counts and widths the blocks run on.
ModelConfig local_config(const ModelConfig& cfg, const ModelShard& shard);
// The ep rank hosting routed expert e of E under a placement (MoeWeights::expert_rank; empty:
// contiguous blocks, rank e / (E/ep)).
inline int expert_rank_of(const std::vector<int>& placement, int64_t e, int64_t E, int ep) {
    return placement.empty() ? static_cast<int>(e / (E / ep)) : placement[static_cast<size_t>(e)];
}

// The routed experts this rank hosts under a placement (MoeWeights::expert_rank; empty: rank r
// hosts [r·E/ep, (r+1)·E/ep)), ascending.
std::vector<int> hosted_experts(const ModelConfig& cfg,
                                const ModelShard& shard,
                                const std::vector<int>& expert_rank);
// The local index of every routed expert on ep rank `ep_rank` ([E]: its position among the
// experts that rank hosts, ascending ids; −1 elsewhere), under a placement (MoeWeights::
// expert_rank; empty: blocks of E/ep).
std::vector<int> local_expert_index(const std::vector<int>& placement,
                                    int64_t n_exp,
                                    int ep,
                                    int ep_rank);

}  // namespace hymoe::model
