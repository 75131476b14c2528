// The router's backward (spec/model-math.md §9): combine-weight gradients → router logits → x.
//   u = s (or s + b when weights_from_biased_scores; b is constant, so du = ds), w̃ = u / (Z + ε),
//   Z = Σ_slots u, w = ρ w̃ when renormalised (ρ u otherwise):
//     du_i = (ρ / (Z + ε)) (dw_i − Σ_j dw_j w̃_j); dropped slots have dw = 0 but their u is in Z;
//   scores → logits: sigmoid dl = du ⊙ s(1 − s) on the chosen experts; softmax
//     dl = s ⊙ (du − Σ_i du_i s_i) over every expert; dx += dl Wᵍ.
// Linear in dw: the expert-parallel backward feeds it each etp slice's partial dw and lets the tp
// all-reduce sum the results.
#include <vector>

#include "hymoe/backend/ops.h"
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
    const int64_t d = cfg.hidden_size;
    const WeightRule rule = weight_rule(cfg);
    // [E] b when the weights gather s + b (b is constant, so du = ds); null when they gather s
    const float* bias = m.correction_bias && m.weights_from_biased_scores
                            ? w.correction_bias.ptr<float>()
                            : nullptr;
    Buffer dlogit(DType::f32, {n_tok, n_exp});      // [n_tok, E]
    std::vector<float> u(static_cast<size_t>(k));   // [k] the gathered scores
    std::vector<float> du(static_cast<size_t>(k));  // [k]
    for (int64_t t = 0; t < n_tok; ++t) {
        const float* st = s.ptr<float>() + t * n_exp;
        const int64_t* idx = r.idx.data() + t * k;
        const float* g = dw.data() + t * k;
        float sum = 0.0f;
        for (int64_t i = 0; i < k; ++i) {
            u[i] = bias ? st[idx[i]] + bias[idx[i]] : st[idx[i]];
            sum += u[i];
        }
        if (rule.renormalize) {
            const float inv = 1.0f / (sum + rule.eps);
            float mean = 0.0f;  // Σ_j dw_j w̃_j
            for (int64_t i = 0; i < k; ++i)
                mean += g[i] * u[i] * inv;
            for (int64_t i = 0; i < k; ++i)
                du[i] = rule.rho * inv * (g[i] - mean);
        } else {
            for (int64_t i = 0; i < k; ++i)
                du[i] = rule.rho * g[i];
        }
        float* dl = dlogit.ptr<float>() + t * n_exp;
        if (m.scoring == Scoring::sigmoid) {
            for (int64_t i = 0; i < k; ++i)
                dl[idx[i]] = du[i] * st[idx[i]] * (1.0f - st[idx[i]]);
        } else {
            float c = 0.0f;  // Σ_i du_i s_idx_i
            for (int64_t i = 0; i < k; ++i)
                c += du[i] * st[idx[i]];
            for (int64_t e = 0; e < n_exp; ++e)
                dl[e] = -st[e] * c;
            for (int64_t i = 0; i < k; ++i)
                dl[idx[i]] += st[idx[i]] * du[i];
        }
    }
    ops::gemm(false,
              false,
              n_tok,
              d,
              n_exp,
              1.0f,
              dlogit.ptr<float>(),
              n_exp,
              w.gate.ptr<float>(),
              d,
              1.0f,
              dx.ptr<float>(),
              d);
}

}  // namespace hymoe::model::detail
