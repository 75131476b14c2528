// The router's two halves (model/ffn.h route()), private to src/model: the scores, and the
// selection, weights and capacity dropping given the scores (also used by the GPU model). The MoE
// backward (moe_backward.cpp) needs the scores route() decided on and the rule that turned them
// into weights, and the router's backward (router_backward.cpp).
#pragma once

#include <vector>

#include "hymoe/backend/ctx.h"
#include "hymoe/model/ffn.h"

namespace hymoe::model::detail {

// s [n_tok, E] = σ(x Wᵍᵀ) or softmax(x Wᵍᵀ) for x [n_tok, d], the logits one token at a time.
Buffer router_scores(const ModelConfig& cfg, const MoeWeights& w, const Tensor& x);
// Its second half: logits [n_tok, E] ← σ(logits) or softmax(logits), in place (the GPU model
// computes the logits on the device and routes on the host).
void router_activate(const ModelConfig& cfg, Tensor& logits);

// route() on the scores s [n_tok, E] of router_scores.
Routing route_scores(const ModelConfig& cfg, const MoeWeights& w, const Tensor& s);
// The same with the correction bias as a host tensor [E] (empty: none).
Routing route_scores(const ModelConfig& cfg, const Tensor& bias, const Tensor& s);

// How route() turns the gathered scores u [top_k] into weights: w = ρ·u / (Σu + eps) when
// renormalize, else ρ·u (then capacity dropping zeroes the dropped ones).
struct WeightRule {
    bool renormalize = true;
    float eps = 0.0f;  // kimi_linear: 1e-20
    float rho = 1.0f;
};
WeightRule weight_rule(const ModelConfig& cfg);

// dx [n_tok, d] += dlogit Wᵍ on ctx's device for the combine-weight gradients dw [n_tok·top_k]
// (host) of routing r, through the weight rule and the scores s [n_tok, E] (host) r was decided
// on; gate [E, d] f32 and the correction bias [E] f32 (empty: none) on ctx's device. Linear in dw.
void router_backward(const backend::Ctx& ctx,
                     const ModelConfig& cfg,
                     const Tensor& gate,
                     const Tensor& bias,
                     const Tensor& s,  // [n_tok, E]
                     const Routing& r,
                     const std::vector<float>& dw,
                     Tensor& dx);  // [n_tok, d] accumulated into

}  // namespace hymoe::model::detail
