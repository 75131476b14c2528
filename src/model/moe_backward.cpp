// Backward of the MoE layer on one process (spec/model-math.md §9), recomputing what the forward
// computed (nothing is saved): the routing is recomputed and held constant (expert choice and
// capacity drops), then
//   routed experts: dExpert_i = w_i · dy_t on each kept slot (t, i), and dw_i = dy_t · Expert_i;
//   combine weights → router: u = s (or s + b when weights_from_biased_scores; b is constant, so
//     du = ds), w̃ = u / (Z + ε), Z = Σ_slots u, w = ρ w̃ when renormalised (ρ u otherwise):
//     du_i = (ρ / (Z + ε)) (dw_i − Σ_j dw_j w̃_j); dropped slots have dw = 0 but their u is in Z;
//   scores → logits: sigmoid dl = du ⊙ s(1 − s) on the chosen experts; softmax
//     dl = s ⊙ (du − Σ_i du_i s_i) over every expert; dx += dl Wᵍ;
//   LatentMoE: dy_lat = dy fc2, the experts on z = fc1 x, dx += dz fc1;
//   shared experts: the dense backward on x.
// Expert adapters accumulate their gradients through dense_ffn_backward, one call per expert (a
// slot shared by every expert sums over them). dx is overwritten.
#include <algorithm>
#include <cstring>
#include <vector>

#include "ffn_backward.h"
#include "hymoe/backend/ops.h"
#include "hymoe/core/error.h"
#include "hymoe/model/ffn.h"
#include "router.h"

namespace hymoe::model {

namespace {

// The routed part's backward for acc [n_tok, w] = Σ_i w_i · Expert_idx_i(z), z [n_tok, w]:
// dz += Σ over kept slots of the expert's input gradient for w_i · dacc_t, and
// dw [n_tok·top_k] = dacc_t · Expert_idx_i(z_t) (0 for dropped slots). Each expert runs on its
// kept tokens in token order, as in the forward.
void routed_experts_backward(const MoeConfig& m,
                             const MoeWeights& w,
                             const Routing& r,
                             const Tensor& z,     // [n_tok, w]
                             const Tensor& dacc,  // [n_tok, w]
                             Tensor& dz,          // [n_tok, w] accumulated into
                             std::vector<float>& dw) {
    const int64_t n_tok = z.dim(0), width = z.dim(1), k = m.top_k;
    dw.assign(static_cast<size_t>(n_tok * k), 0.0f);
    std::vector<std::vector<int64_t>> slots(static_cast<size_t>(m.n_routed_experts));  // [E][..]
    for (size_t a = 0; a < r.idx.size(); ++a)  // token-major: each list is in token order
        if (r.kept[a])
            slots[static_cast<size_t>(r.idx[a])].push_back(static_cast<int64_t>(a));
    const auto row_bytes = static_cast<size_t>(width) * sizeof(float);
    for (size_t e = 0; e < slots.size(); ++e) {
        const std::vector<int64_t>& list = slots[e];
        const auto count = static_cast<int64_t>(list.size());
        if (count == 0)
            continue;
        Buffer in(DType::f32, {count, width});     // [count, w] the expert's tokens of z
        Buffer d_out(DType::f32, {count, width});  // [count, w] w_i · dacc_t
        Buffer out(DType::f32, {count, width});    // [count, w] the expert's outputs
        Buffer d_in(DType::f32, {count, width});   // [count, w]
        for (int64_t j = 0; j < count; ++j) {
            const int64_t a = list[static_cast<size_t>(j)], t = a / k;
            std::memcpy(in.ptr<float>() + j * width, z.ptr<float>() + t * width, row_bytes);
            const float wt = r.weight[static_cast<size_t>(a)];
            const float* g = dacc.ptr<float>() + t * width;
            float* dst = d_out.ptr<float>() + j * width;
            for (int64_t c = 0; c < width; ++c)
                dst[c] = wt * g[c];
        }
        Tensor out_view = out.view();
        detail::dense_ffn_backward_with_output(
            w.experts[e], m.expert_act, in.view(), d_out.view(), d_in.view(), &out_view);
        for (int64_t j = 0; j < count; ++j) {
            const int64_t a = list[static_cast<size_t>(j)], t = a / k;
            const float* g = dacc.ptr<float>() + t * width;
            const float* o = out.ptr<float>() + j * width;
            const float* src = d_in.ptr<float>() + j * width;
            float* dst = dz.ptr<float>() + t * width;
            float dot = 0.0f;
            for (int64_t c = 0; c < width; ++c) {
                dot += g[c] * o[c];
                dst[c] += src[c];
            }
            dw[static_cast<size_t>(a)] = dot;
        }
    }
}

// dx [n_tok, d] += dlogit Wᵍ for the combine-weight gradients dw [n_tok·top_k], through the
// weight rule and the scores s [n_tok, E] of the recomputed routing r.
void router_backward(const ModelConfig& cfg,
                     const MoeWeights& w,
                     const Tensor& s,  // [n_tok, E]
                     const Routing& r,
                     const std::vector<float>& dw,
                     Tensor& dx) {
    const MoeConfig& m = cfg.moe;
    const int64_t n_tok = s.dim(0), n_exp = m.n_routed_experts, k = m.top_k;
    const int64_t d = cfg.hidden_size;
    const detail::WeightRule rule = detail::weight_rule(cfg);
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

}  // namespace

void moe_backward(const ModelConfig& cfg,
                  const LayerSpec& spec,
                  const MoeWeights& w,
                  const Tensor& x,
                  const Tensor& dy,
                  Tensor& dx) {
    const MoeConfig& m = cfg.moe;
    const int64_t n_tok = x.dim(0), d = cfg.hidden_size;
    HYMOE_CHECK(spec.ffn == Ffn::moe || spec.ffn == Ffn::latent_moe, "not an MoE layer");
    HYMOE_CHECK(
        dy.shape == x.shape && dx.shape == x.shape && dx.data != x.data && dx.data != dy.data,
        "moe_backward: x ",
        shape_string(x.shape),
        " dy ",
        shape_string(dy.shape),
        " dx ",
        shape_string(dx.shape),
        " (dx must not alias x or dy)");
    HYMOE_CHECK(static_cast<int64_t>(w.experts.size()) == m.n_routed_experts,
                w.experts.size(),
                " experts loaded, config has ",
                m.n_routed_experts);
    const Buffer scores = detail::router_scores(cfg, w, x);  // [n_tok, E]
    const Routing r = detail::route_scores(cfg, w, scores.view());
    std::vector<float> dw;  // [n_tok·top_k] ∂L/∂w of each slot
    if (spec.ffn == Ffn::latent_moe) {
        const int64_t ell = m.latent_size;
        Buffer z(DType::f32, {n_tok, ell});       // [n_tok, ℓ] fc1 x
        Buffer dy_lat(DType::f32, {n_tok, ell});  // [n_tok, ℓ] dy fc2
        Buffer dz(DType::f32, {n_tok, ell});      // [n_tok, ℓ]
        ops::linear(x, w.fc1_latent_proj.view(), z.view());
        ops::gemm(false,
                  false,
                  n_tok,
                  ell,
                  d,
                  1.0f,
                  dy.ptr<float>(),
                  d,
                  w.fc2_latent_proj.ptr<float>(),
                  ell,
                  0.0f,
                  dy_lat.ptr<float>(),
                  ell);
        routed_experts_backward(m, w, r, z.view(), dy_lat.view(), dz.view(), dw);
        ops::gemm(false,
                  false,
                  n_tok,
                  d,
                  ell,
                  1.0f,
                  dz.ptr<float>(),
                  ell,
                  w.fc1_latent_proj.ptr<float>(),
                  d,
                  0.0f,
                  dx.ptr<float>(),
                  d);
    } else {
        std::fill(dx.ptr<float>(), dx.ptr<float>() + n_tok * d, 0.0f);
        routed_experts_backward(m, w, r, x, dy, dx, dw);
    }
    router_backward(cfg, w, scores.view(), r, dw, dx);
    if (m.n_shared_experts > 0) {
        Buffer shared(DType::f32, {n_tok, d});  // [n_tok, d]
        dense_ffn_backward(w.shared, m.expert_act, x, dy, shared.view());
        ops::add_inplace(dx, shared.view());
    }
}

}  // namespace hymoe::model
