// The CPU forms of the router's score backward and the cross-entropy rows
// (hymoe/backend/ops_router_loss.h): the loops model/router_backward.cpp and model/train.cpp ran
// inline before they were ops, in the same order.
#include <algorithm>
#include <cmath>
#include <vector>

#include "hymoe/backend/ops_router_loss.h"
#include "hymoe/core/error.h"

namespace hymoe::ops {

void router_scores_backward(const Tensor& s,
                            const Tensor& idx,
                            const Tensor& dw,
                            const Tensor& bias,
                            const RouterGradRule& rule,
                            Tensor& dlogit) {
    const int64_t n_tok = s.dim(0), n_exp = s.dim(1), k = idx.numel() / std::max<int64_t>(1, n_tok);
    HYMOE_CHECK(s.dtype == DType::f32 && idx.dtype == DType::i64 && dw.dtype == DType::f32 &&
                    dlogit.dtype == DType::f32 && idx.numel() == n_tok * k &&
                    dw.numel() == n_tok * k && dlogit.shape == s.shape &&
                    (bias.data == nullptr || bias.numel() == n_exp),
                "router_scores_backward: s ",
                shape_string(s.shape),
                " idx ",
                shape_string(idx.shape),
                " dw ",
                shape_string(dw.shape),
                " dlogit ",
                shape_string(dlogit.shape));
    const float* b = bias.data ? bias.ptr<float>() : nullptr;  // [E]
    std::vector<float> u(static_cast<size_t>(k));              // [k] the gathered scores
    std::vector<float> du(static_cast<size_t>(k));             // [k]
    std::fill_n(dlogit.ptr<float>(), dlogit.numel(), 0.0f);
    for (int64_t t = 0; t < n_tok; ++t) {
        const float* st = s.ptr<float>() + t * n_exp;
        const int64_t* id = idx.ptr<int64_t>() + t * k;
        const float* g = dw.ptr<float>() + t * k;
        float sum = 0.0f;
        for (int64_t i = 0; i < k; ++i) {
            HYMOE_CHECK(id[i] >= 0 && id[i] < n_exp, "router_scores_backward: expert ", id[i]);
            u[i] = b ? st[id[i]] + b[id[i]] : st[id[i]];
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
        if (rule.sigmoid) {
            for (int64_t i = 0; i < k; ++i)
                dl[id[i]] = du[i] * st[id[i]] * (1.0f - st[id[i]]);
        } else {
            float c = 0.0f;  // Σ_i du_i s_idx_i
            for (int64_t i = 0; i < k; ++i)
                c += du[i] * st[id[i]];
            for (int64_t e = 0; e < n_exp; ++e)
                dl[e] = -st[e] * c;
            for (int64_t i = 0; i < k; ++i)
                dl[id[i]] += st[id[i]] * du[i];
        }
    }
}

CrossEntropyRows cross_entropy_rows(Tensor& logits, const Tensor& targets, double scale) {
    const int64_t k = logits.dim(0), V = logits.dim(1);
    HYMOE_CHECK(logits.dtype == DType::f32 && targets.dtype == DType::i64 && targets.numel() == k &&
                    logits.shape.size() == 2,
                "cross_entropy_rows: logits ",
                shape_string(logits.shape),
                " targets ",
                shape_string(targets.shape));
    CrossEntropyRows out;
    out.loss.resize(static_cast<size_t>(k));
    out.best.resize(static_cast<size_t>(k));
    for (int64_t r = 0; r < k; ++r) {
        float* z = logits.ptr<float>() + r * V;
        const int64_t target = targets.ptr<int64_t>()[r];
        HYMOE_CHECK(target >= 0 && target < V, "cross_entropy_rows: target ", target, " of ", V);
        const int64_t best = std::max_element(z, z + V) - z;
        const double zmax = z[best];
        double sum = 0;
        for (int64_t v = 0; v < V; ++v)
            sum += std::exp(static_cast<double>(z[v]) - zmax);
        out.loss[static_cast<size_t>(r)] = std::log(sum) + zmax - static_cast<double>(z[target]);
        out.best[static_cast<size_t>(r)] = best;
        for (int64_t v = 0; v < V; ++v)  // dlogits = scale·(softmax − onehot)
            z[v] = static_cast<float>(scale * std::exp(static_cast<double>(z[v]) - zmax) / sum);
        z[target] -= static_cast<float>(scale);
    }
    return out;
}

}  // namespace hymoe::ops
