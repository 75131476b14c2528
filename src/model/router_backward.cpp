// The router's backward (spec/model-math.md §9): combine-weight gradients → router logits → x.
//   u = s (or s + b when weights_from_biased_scores; b is constant, so du = ds), w̃ = u / (Z + ε),
//   Z = Σ_slots u, w = ρ w̃ when renormalised (ρ u otherwise):
//     du_i = (ρ / (Z + ε)) (dw_i − Σ_j dw_j w̃_j); dropped slots have dw = 0 but their u is in Z;
//   scores → logits: sigmoid dl = du ⊙ s(1 − s) on the chosen experts; softmax
//     dl = s ⊙ (du − Σ_i du_i s_i) over every expert; dx += dl Wᵍ.
// Linear in dw: the expert-parallel backward feeds it each etp slice's partial dw and lets the tp
// all-reduce sum the results. Both steps are ops (ops::router_scores_backward, linear_backward) on
// the layer's Ctx; the scores, the routing and dw are host arrays, copied to its device first.
#include <vector>

#include "hymoe/backend/ops_backward.h"
#include "hymoe/backend/ops_router_loss.h"
#include "moe_grouped.h"
#include "router.h"

namespace hymoe::model::detail {

void router_backward(const backend::Ctx& ctx,
                     const ModelConfig& cfg,
                     const Tensor& gate,
                     const Tensor& bias,
                     const Tensor& s,  // [n_tok, E]
                     const Routing& r,
                     const std::vector<float>& dw,
                     Tensor& dx) {
    const MoeConfig& m = cfg.moe;
    const int64_t n_tok = s.dim(0), n_exp = m.n_routed_experts, k = m.top_k;
    if (n_tok == 0)
        return;
    const WeightRule rule = weight_rule(cfg);
    backend::Scratch scratch(ctx);
    Tensor scores = scratch(DType::f32, {n_tok, n_exp});  // [n_tok, E]
    ops::upload(ctx, s, scores);
    Tensor idx = copied(ctx, scratch, r.idx, DType::i64);  // [n_tok, k]
    Tensor g = copied(ctx, scratch, dw, DType::f32);       // [n_tok, k]
    idx.shape = g.shape = {n_tok, k};
    Tensor dlogit = scratch(DType::f32, {n_tok, n_exp});  // [n_tok, E]
    // [E] b when the weights gather s + b (b is constant, so du = ds); empty when they gather s
    ops::router_scores_backward(
        ctx,
        scores,
        idx,
        g,
        m.correction_bias && m.weights_from_biased_scores ? bias : Tensor{},
        {rule.renormalize, rule.eps, rule.rho, m.scoring == Scoring::sigmoid},
        dlogit);
    ops::linear_backward(ctx, dlogit, gate, dx, 1.0f);  // dx += dlogit Wᵍ
}

}  // namespace hymoe::model::detail
