// The MoE layer forward (spec/model-math.md §6-7) in Megatron's four phases on one process:
// route → dispatch (gather each expert's kept tokens, in token order, into one contiguous block
// per expert) → expert computation (each expert on its block) → combine (each token adds
// w_i · out_i over its top-k slots in slot order, in fp32, so the sum never depends on the order
// the experts ran in). LatentMoE projects x → z = fc1 x before dispatch and the combined
// y_lat → fc2 y_lat after; the shared experts always run on the full-width x and are added last.
// The router runs one token at a time (router.cpp), so a token's expert choice is a function of
// its own x bit for bit, whatever shares its batch; the expert, latent and shared products are
// batched GEMMs over each expert's gathered rows (BLAS may round a row differently with its
// position in a call, so outputs agree across batchings to ~1e-6, not bit for bit).
#include <utility>
#include <vector>

#include "hymoe/backend/ops.h"
#include "hymoe/core/error.h"
#include "hymoe/model/ffn.h"
#include "moe_experts.h"

namespace hymoe::model {

namespace {

// The routed part: acc [n_tok, w] = Σ_i w_i · Expert_idx_i(z) for z [n_tok, w]; each token's
// adapter from token_adapter ([n_tok], empty: adapter 0).
void routed_experts(const MoeConfig& m,
                    const MoeWeights& w,
                    const Routing& r,
                    const Tensor& z /*[n_tok, w]*/,
                    Tensor& acc /*[n_tok, w]*/,
                    const std::vector<int>& token_adapter) {
    const std::vector<int32_t> experts = detail::kept_experts(r);  // [n_tok, top_k]
    const detail::RowSlots slots{experts.data(),
                                 r.weight.data(),
                                 z.dim(0),
                                 m.top_k,
                                 token_adapter.empty() ? nullptr : token_adapter.data()};
    std::vector<int64_t> computed(static_cast<size_t>(m.n_routed_experts), 0);  // [E]
    detail::experts_forward(
        w, m.expert_act, slots, z, acc, [] {}, computed);
}

}  // namespace

void moe_forward(const ModelConfig& cfg,
                 const LayerSpec& spec,
                 const MoeWeights& w,
                 const Tensor& x /*[n_tok, d]*/,
                 Tensor& y /*[n_tok, d]*/,
                 Routing* routing_out,
                 const SeqBatch* rows) {
    const MoeConfig& m = cfg.moe;
    const int64_t n_tok = x.dim(0), d = cfg.hidden_size;
    HYMOE_CHECK(spec.ffn == Ffn::moe || spec.ffn == Ffn::latent_moe, "not an MoE layer");
    HYMOE_CHECK(y.shape == x.shape && y.data != x.data,
                "x ",
                shape_string(x.shape),
                " y ",
                shape_string(y.shape));
    HYMOE_CHECK(static_cast<int64_t>(w.experts.size()) == m.n_routed_experts,
                w.experts.size(),
                " experts loaded, config has ",
                m.n_routed_experts);
    Routing r = route(cfg, w, x);
    const std::vector<int> token_adapter = rows ? row_adapters(*rows) : std::vector<int>();
    if (spec.ffn == Ffn::latent_moe) {
        const int64_t ell = m.latent_size;
        Buffer z(DType::f32, {n_tok, ell});      // [n_tok, ℓ] fc1 x
        Buffer y_lat(DType::f32, {n_tok, ell});  // [n_tok, ℓ] combined expert outputs
        ops::linear(x, w.fc1_latent_proj.view(), z.view());
        routed_experts(m, w, r, z.view(), y_lat.view(), token_adapter);
        ops::linear(y_lat.view(), w.fc2_latent_proj.view(), y);
    } else {
        routed_experts(m, w, r, x, y, token_adapter);
    }
    if (m.n_shared_experts > 0) {
        Buffer shared(DType::f32, {n_tok, d});  // [n_tok, d]
        dense_ffn_forward(w.shared, m.expert_act, x, shared.view(), rows);
        ops::add_inplace(y, shared.view());
    }
    if (routing_out)
        *routing_out = std::move(r);
}

}  // namespace hymoe::model
