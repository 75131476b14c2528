// One rank's part of the model (model/shard.h): stage ranges, the local config, hosted experts
// and their local indices.
#include "hymoe/model/shard.h"

#include <cstdint>

#include "hymoe/core/error.h"

namespace hymoe::model {

std::vector<int> stage_starts(const ModelConfig& cfg, int pp) {
    const int L = static_cast<int>(cfg.layers.size());
    std::vector<int> s;
    if (!cfg.stage_boundaries.empty() && static_cast<int>(cfg.stage_boundaries.size()) + 1 == pp) {
        s.push_back(0);
        s.insert(s.end(), cfg.stage_boundaries.begin(), cfg.stage_boundaries.end());
    } else {
        for (int i = 0; i < pp; ++i)
            s.push_back(static_cast<int>(static_cast<int64_t>(i) * L / pp));
    }
    s.push_back(L);
    return s;
}

ModelShard whole_model(const ModelConfig& cfg) {
    ModelShard s;
    s.end_layer = static_cast<int>(cfg.layers.size());
    return s;
}

ModelShard make_shard(const ModelConfig& cfg,
                      const parallel::Layout& layout,
                      const parallel::Coords& me) {
    ModelShard s;
    s.tp = layout.tp, s.tp_rank = me.tp;
    s.etp = layout.etp, s.etp_rank = me.etp;
    s.ep = layout.ep, s.ep_rank = me.ep;
    s.pp = layout.pp, s.stage = me.pp;
    const std::vector<int> starts = stage_starts(cfg, layout.pp);
    s.first_layer = starts[me.pp], s.end_layer = starts[me.pp + 1];
    return s;
}

ModelConfig local_config(const ModelConfig& cfg, const ModelShard& shard) {
    ModelConfig c = cfg;
    c.kda.n_head /= shard.tp;
    c.mla.n_head /= shard.tp;
    c.indexer.scale_heads = cfg.indexer.n_head;
    c.indexer.n_head /= shard.tp;
    c.intermediate_size /= shard.tp;
    c.moe.shared_intermediate /= shard.tp;
    c.moe.moe_intermediate /= shard.etp;
    return c;
}

std::vector<int> hosted_experts(const ModelConfig& cfg,
                                const ModelShard& shard,
                                const std::vector<int>& expert_rank) {
    const int n_exp = cfg.moe.n_routed_experts;
    std::vector<int> hosted;
    for (int e = 0; e < n_exp; ++e)
        if (expert_rank_of(expert_rank, e, n_exp, shard.ep) == shard.ep_rank)
            hosted.push_back(e);
    return hosted;
}

std::vector<int> local_expert_index(const std::vector<int>& placement,
                                    int64_t n_exp,
                                    int ep,
                                    int ep_rank) {
    HYMOE_CHECK(ep >= 1 && n_exp % ep == 0 &&
                    (placement.empty() || static_cast<int64_t>(placement.size()) == n_exp),
                "local_expert_index: ",
                n_exp,
                " experts over ep ",
                ep,
                " with a placement of ",
                placement.size());
    std::vector<int> local(static_cast<size_t>(n_exp), -1);
    int next = 0;
    for (int64_t e = 0; e < n_exp; ++e)
        if (expert_rank_of(placement, e, n_exp, ep) == ep_rank)
            local[static_cast<size_t>(e)] = next++;
    return local;
}

}  // namespace hymoe::model
