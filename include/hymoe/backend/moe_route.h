// The MoE router's logits and selection as ops on a Ctx (spec/model-math.md §6, model/ffn.h
// route()): from the router logits [n_tok, E], each token's top_k experts and combine weights under
// one POD rule that both backends read. CPU form: the scores s = σ(logits) or softmax(logits) in
// place, then per token s' = s + b (selection only), the group limit (groups scored by their top-2
// s' with a bias, their best s without; the topk_group best kept, the others' choice scores set to
// group_fill), top_k of the choice scores (ties → smaller id), weights gathered from s (or s'),
// renormalised u / (Σu + eps), times ρ: model/router.cpp's arithmetic in its order. CUDA form:
// moe_route.cu, one warp per token (the scores are not kept). Dropless: capacity dropping, which
// looks at every token of the call, is the caller's (model/router.cpp). The switch is
// src/backend/ops_moe.cpp's.
#pragma once

#include <cstdint>
#include <limits>

#include "hymoe/backend/ctx.h"
#include "hymoe/tensor/tensor.h"

namespace hymoe::ops {

struct MoeRouteRule {
    int64_t n_exp = 0;  // E
    int64_t top_k = 0;
    int64_t n_group = 1;
    int64_t topk_group = 1;
    bool softmax = false;              // scores by softmax over E, else σ
    bool renormalize = true;           // w = u / (Σu + renorm_eps), else u
    float renorm_eps = 0.0f;           // kimi_linear: 1e-20
    float scale = 1.0f;                // ρ
    bool weights_from_biased = false;  // gather the weights from s + b
    float group_fill = -std::numeric_limits<float>::infinity();  // kimi_linear: 0
};

// logits [n_tok, E] f32 = x [n_tok, d] · gate [E, d]ᵀ, fp32: on the CPU one token at a time (a
// GEMV each, so a token's routing never depends on what shares its call), on CUDA one GEMM.
void router_logits(const backend::Ctx& ctx, const Tensor& x, const Tensor& gate, Tensor& logits);

// CPU form of the selection on scores s [n_tok, E] (already σ or softmax): idx [n_tok, top_k]
// best first and weight [n_tok, top_k]; bias [E] or null.
void moe_select(
    const MoeRouteRule& rule, const Tensor& s, const float* bias, int64_t* idx, float* weight);

// logits [n_tok, E] f32 (the CPU form leaves the scores s in it; CUDA leaves it alone) → idx
// [n_tok, top_k] i32 and weight [n_tok, top_k] f32; bias [E] f32, or empty for none.
void moe_route(const backend::Ctx& ctx,
               const MoeRouteRule& rule,
               Tensor& logits,
               const Tensor& bias,
               Tensor& idx,
               Tensor& weight);

}  // namespace hymoe::ops
