// The router's backward (spec/model-math.md §9): combine-weight gradients → router logits → x.
//   u = s (or s + b when weights_from_biased_scores; b is constant, so du = ds), w̃ = u / (Z + ε),
//   Z = Σ_slots u, w = ρ w̃ when renormalised (ρ u otherwise):
//     du_i = (ρ / (Z + ε)) (dw_i − Σ_j dw_j w̃_j); dropped slots have dw = 0 but their u is in Z;
//   scores → logits: sigmoid dl = du ⊙ s(1 − s) on the chosen experts; softmax
//     dl = s ⊙ (du − Σ_i du_i s_i) over every expert; dx += dl Wᵍ.
// Linear in dw: the expert-parallel backward feeds it each etp slice's partial dw and lets the tp
// all-reduce sum the results. Both steps are ops (ops::router_scores_backward, linear_backward), on
// the CPU context here: the routing and dw are host arrays.
#include <vector>

#include "hymoe/backend/ops_backward.h"
#include "hymoe/backend/ops_router_loss.h"
#include "router.h"

namespace hymoe::model::detail {

void router_backward(const ModelConfig& cfg,
                     const MoeWeights& w,
                     const Tensor& s,  // [n_tok, E]
                     const Routing& r,
                     const std::vector<float>& dw,
                     Tensor& dx) {
    const MoeConfig& m = cfg.moe;
    const int64_t n_tok = s.dim(0), n_exp = m.n_routed_experts, k = m.top_k;
    const WeightRule rule = weight_rule(cfg);
    const backend::Ctx cpu = backend::cpu_ctx();  // the routing and dw are host arrays
    // [E] b when the weights gather s + b (b is constant, so du = ds); empty when they gather s
    const Tensor bias =
        m.correction_bias && m.weights_from_biased_scores ? w.correction_bias.view() : Tensor{};
    const Tensor idx{const_cast<int64_t*>(r.idx.data()), DType::i64, Device::cpu, {n_tok, k}};
    const Tensor g{const_cast<float*>(dw.data()), DType::f32, Device::cpu, {n_tok, k}};
    Buffer dlogit(DType::f32, {n_tok, n_exp});  // [n_tok, E]
    ops::router_scores_backward(
        cpu,
        s,
        idx,
        g,
        bias,
        {rule.renormalize, rule.eps, rule.rho, m.scoring == Scoring::sigmoid},
        dlogit.view());
    ops::linear_backward(cpu, dlogit.view(), w.gate.view(), dx, 1.0f);  // dx += dlogit Wᵍ
}

}  // namespace hymoe::model::detail
