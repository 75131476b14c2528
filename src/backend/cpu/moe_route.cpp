// The CPU form of the router's selection (hymoe/backend/moe_route.h): per token the biased
// choice scores, the group limit, top-k, the weights and their renormalisation, in
// model/router.cpp's order.
#include "hymoe/backend/moe_route.h"

#include <algorithm>
#include <vector>

#include "hymoe/backend/ops.h"

namespace hymoe::ops {

namespace {

// Group-limited selection (n_group > 1): score each group of E/G consecutive experts by the sum
// of its top-2 biased scores (with a bias) or its best one (without), keep the topk_group best
// groups (ties → smaller group) and overwrite the others' choice scores with `fill`.
void mask_groups(const MoeRouteRule& r, bool has_bias, float* choice /*[E]*/) {
    const int64_t n_group = r.n_group, per_group = r.n_exp / r.n_group;
    std::vector<float> group_score(static_cast<size_t>(n_group));  // [G]
    for (int64_t g = 0; g < n_group; ++g) {
        const float* s = choice + g * per_group;
        if (has_bias) {
            int64_t top2[2];
            top_k(s, per_group, 2, top2);
            group_score[static_cast<size_t>(g)] = s[top2[0]] + s[top2[1]];
        } else {
            group_score[static_cast<size_t>(g)] = *std::max_element(s, s + per_group);
        }
    }
    std::vector<int64_t> kept_groups(static_cast<size_t>(r.topk_group));  // [topk_group]
    top_k(group_score.data(), n_group, r.topk_group, kept_groups.data());
    std::vector<uint8_t> keep(static_cast<size_t>(n_group), 0);  // [G]
    for (int64_t g : kept_groups)
        keep[static_cast<size_t>(g)] = 1;
    for (int64_t g = 0; g < n_group; ++g)
        if (!keep[static_cast<size_t>(g)])
            std::fill(choice + g * per_group, choice + (g + 1) * per_group, r.group_fill);
}

}  // namespace

void moe_select(const MoeRouteRule& rule,
                const Tensor& s_all,
                const float* bias,
                int64_t* idx_all,
                float* weight) {
    const int64_t n_exp = rule.n_exp, k = rule.top_k, n_tok = s_all.dim(0);
    std::vector<float> biased(static_cast<size_t>(n_exp));  // [E] s' = s + b
    std::vector<float> choice(static_cast<size_t>(n_exp));  // [E] s' with masked groups
    for (int64_t t = 0; t < n_tok; ++t) {
        const float* s = s_all.ptr<float>() + t * n_exp;
        for (int64_t e = 0; e < n_exp; ++e)
            biased[static_cast<size_t>(e)] = bias ? s[e] + bias[e] : s[e];
        choice = biased;
        if (rule.n_group > 1)
            mask_groups(rule, bias != nullptr, choice.data());
        int64_t* idx = idx_all + t * k;
        float* wt = weight + t * k;
        top_k(choice.data(), n_exp, k, idx);
        const float* source = rule.weights_from_biased ? biased.data() : s;
        float sum = 0.0f;
        for (int64_t i = 0; i < k; ++i) {
            wt[i] = source[idx[i]];
            sum += wt[i];
        }
        for (int64_t i = 0; i < k; ++i) {
            if (rule.renormalize)
                wt[i] /= sum + rule.renorm_eps;
            wt[i] *= rule.scale;
        }
    }
}

}  // namespace hymoe::ops
