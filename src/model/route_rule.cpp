// The router's rule from a config (route_rule.h), by router.h's weight_rule.
#include "route_rule.h"

#include "router.h"

namespace hymoe::model::detail {

ops::MoeRouteRule route_rule(const ModelConfig& cfg) {
    const MoeConfig& m = cfg.moe;
    const WeightRule w = weight_rule(cfg);
    ops::MoeRouteRule r;
    r.n_exp = m.n_routed_experts;
    r.top_k = m.top_k;
    r.n_group = m.n_group;
    r.topk_group = m.topk_group;
    r.softmax = m.scoring == Scoring::softmax;
    r.renormalize = w.renormalize;
    r.renorm_eps = w.eps;
    r.scale = w.rho;
    r.weights_from_biased = m.weights_from_biased_scores;
    if (cfg.model_type == "kimi_linear")  // the masked groups' scores (router.cpp)
        r.group_fill = 0.0f;
    return r;
}

}  // namespace hymoe::model::detail
