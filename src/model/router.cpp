// MoE routing (spec/model-math.md §6), fp32 end to end: router logits, sigmoid/softmax scores,
// bias-corrected selection with optional group limiting, weight gather, renormalisation, ρ, and
// Megatron-style capacity dropping. Family differences are modelled only where they change
// results:
//   - kimi_linear fills the masked groups' scores with 0.0 (its HF KimiMoEGate), the others
//     with −inf (DS32 Gate). They differ only when a kept expert's s + b ≤ 0 (b < −s), where
//     Kimi can pick an expert of a dropped group; Kimi-Linear itself has one group, no mask.
//   - kimi_linear renormalises with Σw + 1e-20 and only when top_k > 1; DS32 divides by Σw.
//   - weights_from_biased_scores gathers the weights from s + b (the HF Kimi in-place alias
//     quirk); DS32 and vLLM gather from s (the default).
// Renormalisation follows MoeConfig::renormalize for either scoring (HF norm_topk_prob /
// moe_renormalize; the HF config readers set it).
#include "router.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "hymoe/backend/moe_route.h"
#include "hymoe/backend/ops.h"
#include "hymoe/core/error.h"
#include "hymoe/model/ffn.h"
#include "route_rule.h"

namespace hymoe::model {

namespace {

// Capacity dropping (Megatron apply_router_token_dropping): C = ceil(n_tok·k/E · CF); an expert
// over capacity keeps the C assignments with the largest weight (probs; equal weights → the
// earlier token) or of the earliest tokens (position).
void drop_over_capacity(const MoeConfig& m, int64_t n_tok, Routing& r) {
    const int64_t k = m.top_k;
    const double tokens = static_cast<double>(n_tok) * static_cast<double>(k);
    const auto capacity = static_cast<int64_t>(
        std::ceil(tokens / static_cast<double>(m.n_routed_experts) * m.capacity_factor));
    std::vector<std::vector<int64_t>> slots(static_cast<size_t>(m.n_routed_experts));  // [E][..]
    for (int64_t a = 0; a < n_tok * k; ++a)  // token-major: each list is in token order
        slots[static_cast<size_t>(r.idx[static_cast<size_t>(a)])].push_back(a);
    for (std::vector<int64_t>& list : slots) {
        if (static_cast<int64_t>(list.size()) <= capacity)
            continue;
        if (m.drop_policy == DropPolicy::probs)
            std::stable_sort(list.begin(), list.end(), [&](int64_t a, int64_t b) {
                return r.weight[static_cast<size_t>(a)] > r.weight[static_cast<size_t>(b)];
            });
        for (size_t j = static_cast<size_t>(capacity); j < list.size(); ++j) {
            const auto a = static_cast<size_t>(list[j]);
            r.kept[a] = 0;
            r.weight[a] = 0.0f;
            --r.tokens_per_expert[static_cast<size_t>(r.idx[a])];
            ++r.dropped;
        }
    }
}

}  // namespace

namespace detail {

Buffer router_scores(const ModelConfig& cfg, const MoeWeights& w, const Tensor& x) {
    const int64_t n_exp = cfg.moe.n_routed_experts, n_tok = x.dim(0);
    HYMOE_CHECK(x.shape.size() == 2 && x.dim(1) == cfg.hidden_size, "x ", shape_string(x.shape));
    HYMOE_CHECK(w.gate.view().shape == Shape({n_exp, cfg.hidden_size}),
                "gate.weight ",
                shape_string(w.gate.view().shape));
    // Logits one token at a time (GEMV), so a token's routing never depends on its row position
    // (see moe.cpp).
    Buffer scores(DType::f32, {n_tok, n_exp});  // [n_tok, E] logits, then s
    for (int64_t t = 0; t < n_tok; ++t) {
        Tensor row = scores.view().rows(t, 1);
        ops::linear(x.rows(t, 1), w.gate.view(), row);
    }
    router_activate(cfg, scores.view());
    return scores;
}

void router_activate(const ModelConfig& cfg, Tensor& logits) {
    if (cfg.moe.scoring == Scoring::sigmoid)
        ops::sigmoid_inplace(logits);
    else
        ops::softmax_rows(logits.ptr<float>(), logits.dim(0), logits.dim(1));
}

WeightRule weight_rule(const ModelConfig& cfg) {
    const bool kimi = cfg.model_type == "kimi_linear";
    return {cfg.moe.renormalize && (!kimi || cfg.moe.top_k > 1),
            kimi ? 1e-20f : 0.0f,
            static_cast<float>(cfg.moe.routed_scaling_factor)};
}

Routing route_scores(const ModelConfig& cfg, const MoeWeights& w, const Tensor& s) {
    return route_scores(cfg, w.correction_bias.view(), s);
}

Routing route_scores(const ModelConfig& cfg, const Tensor& bias_t, const Tensor& s_all) {
    const MoeConfig& m = cfg.moe;
    const int64_t n_exp = m.n_routed_experts, k = m.top_k, n_tok = s_all.dim(0);
    const bool has_bias = m.correction_bias;
    HYMOE_CHECK(s_all.shape == Shape({n_tok, n_exp}), "scores ", shape_string(s_all.shape));
    HYMOE_CHECK(!has_bias || (bias_t.shape == Shape({n_exp}) && bias_t.device == Device::cpu),
                "e_score_correction_bias ",
                shape_string(bias_t.shape));
    HYMOE_CHECK(m.n_group >= 1 && n_exp % m.n_group == 0 && m.topk_group <= m.n_group &&
                    k <= m.topk_group * (n_exp / m.n_group) &&
                    (m.n_group == 1 || !has_bias || n_exp / m.n_group >= 2),
                "E ",
                n_exp,
                ", top_k ",
                k,
                ", n_group ",
                m.n_group,
                ", topk_group ",
                m.topk_group);

    Routing r;
    r.idx.resize(static_cast<size_t>(n_tok * k));
    r.weight.resize(static_cast<size_t>(n_tok * k));
    r.kept.assign(static_cast<size_t>(n_tok * k), 1);
    r.tokens_per_expert.assign(static_cast<size_t>(n_exp), 0);
    const float* bias = has_bias ? bias_t.ptr<float>() : nullptr;  // [E]
    ops::moe_select(route_rule(cfg), s_all, bias, r.idx.data(), r.weight.data());
    for (int64_t e : r.idx)
        ++r.tokens_per_expert[static_cast<size_t>(e)];
    if (m.capacity_factor > 0.0)
        drop_over_capacity(m, n_tok, r);
    return r;
}

}  // namespace detail

Routing route(const ModelConfig& cfg, const MoeWeights& w, const Tensor& x /*[n_tok, d]*/) {
    const Buffer scores = detail::router_scores(cfg, w, x);  // [n_tok, E]
    return detail::route_scores(cfg, w, scores.view());
}

}  // namespace hymoe::model
