// Backward of the MoE layer on one process (spec/model-math.md §9), recomputing what the forward
// computed (nothing is saved): the routing is recomputed and held constant (expert choice and
// capacity drops), then
//   routed experts (moe_experts.cpp): dExpert_i = w_i · dy_t on each kept slot (t, i), and
//     dw_i = dy_t · Expert_i, each expert once on its kept tokens in token order, as the forward;
//   combine weights → router logits → x (router_backward.cpp; the correction bias has none);
//   LatentMoE: dy_lat = dy fc2, the experts on z = fc1 x, dx += dz fc1;
//   shared experts: the dense backward on x.
// Expert adapters accumulate their gradients through the dense backward, one call per expert (a
// slot shared by every expert sums over them). dx is overwritten.
#include <vector>

#include "hymoe/backend/ops.h"
#include "hymoe/core/error.h"
#include "hymoe/model/ffn.h"
#include "moe_experts.h"
#include "router.h"

namespace hymoe::model {

namespace {

// The routed part's backward for acc [n_tok, w] = Σ_i w_i · Expert_idx_i(z): dz [n_tok, w] is
// overwritten with Σ over kept slots of the expert's input gradient for w_i · dacc_t, and
// dw [n_tok·top_k] = dacc_t · Expert_idx_i(z_t) (0 for dropped slots).
void routed_experts_backward(const MoeConfig& m,
                             const MoeWeights& w,
                             const Routing& r,
                             const Tensor& z,     // [n_tok, w]
                             const Tensor& dacc,  // [n_tok, w]
                             Tensor& dz,          // [n_tok, w]
                             std::vector<float>& dw) {
    const std::vector<int32_t> experts = detail::kept_experts(r);  // [n_tok, top_k]
    const detail::RowSlots slots{experts.data(), r.weight.data(), z.dim(0), m.top_k};
    dw.assign(r.idx.size(), 0.0f);
    std::vector<int64_t> computed(static_cast<size_t>(m.n_routed_experts), 0);  // [E]
    detail::experts_backward(
        w, m.expert_act, slots, z, dacc, dz, dw.data(), [] {}, computed);
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
        detail::latent_output_backward(w.fc2_latent_proj.view(), dy, dy_lat.view());
        routed_experts_backward(m, w, r, z.view(), dy_lat.view(), dz.view(), dw);
        detail::latent_input_backward(w.fc1_latent_proj.view(), dz.view(), dx);
    } else {
        routed_experts_backward(m, w, r, x, dy, dx, dw);
    }
    detail::router_backward(cfg, w, scores.view(), r, dw, dx);
    if (m.n_shared_experts > 0) {
        Buffer shared(DType::f32, {n_tok, d});  // [n_tok, d]
        dense_ffn_backward(w.shared, m.expert_act, x, dy, shared.view());
        ops::add_inplace(dx, shared.view());
    }
}

}  // namespace hymoe::model
