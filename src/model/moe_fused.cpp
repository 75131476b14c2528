// The fused MoE choice and branch (model/moe_parallel.h moe_runs_fused, moe_fused.h): one rank's
// layer with routing, dispatch, grouped SwiGLU experts and combine on the device
// (backend/ops_moe_fused.h), no host round trip unless the expert load is asked.
#include "moe_fused.h"

#include <vector>

#include "hymoe/backend/moe_route.h"
#include "hymoe/backend/ops.h"
#include "hymoe/backend/ops_moe_fused.h"
#include "hymoe/backend/ops_rows.h"
#include "hymoe/model/ffn_views.h"
#include "route_rule.h"

namespace hymoe::model {

bool moe_runs_fused(Device device,
                    const ModelConfig& cfg,
                    const LayerSpec& spec,
                    DType act,
                    int64_t n_tok,
                    const MoeParallel& par,
                    bool expert_adapters) {
    const MoeConfig& m = cfg.moe;
    ops::MoeFusedShape s;
    s.act = act;
    s.swiglu = m.expert_act == ExpertAct::swiglu;
    s.dropless = m.capacity_factor <= 0.0;
    s.n_tok = n_tok;
    s.top_k = m.top_k;
    s.n_exp = m.n_routed_experts;
    s.width = spec.ffn == Ffn::latent_moe ? m.latent_size : cfg.hidden_size;
    s.inter = m.moe_intermediate;
    return device == Device::cuda && par.fused && par.tp == nullptr && par.ep == nullptr &&
           !expert_adapters && ops::moe_fused_supported(s);
}

namespace detail {

void moe_forward_fused(const backend::Ctx& ctx,
                       const ModelConfig& cfg,
                       const LayerSpec& spec,
                       const MoeWeightViews& local,
                       const Tensor& x /*[n, d]*/,
                       Tensor& y /*[n, d]*/,
                       bool load,
                       MoeCommStats* stats,
                       const SeqBatch* rows,
                       const std::vector<LoraRowsView>* lora_rows) {
    const MoeConfig& m = cfg.moe;
    const int64_t n = x.dim(0), d = cfg.hidden_size, k = m.top_k, n_exp = m.n_routed_experts;
    const bool latent = spec.ffn == Ffn::latent_moe;
    const int64_t width = latent ? m.latent_size : d;
    MoeCommStats one;  // one rank, fused: only its expert load
    one.calls = 1;
    if (n == 0) {  // no launch of an empty grid
        if (stats != nullptr)
            stats->add(one);
        return;
    }
    backend::Scratch s(ctx);
    auto in_act = [&](const Tensor& t) {  // t itself in local.act, else a cast copy
        if (t.dtype == local.act)
            return t;
        Tensor c = s(local.act, t.shape);
        ops::cast(ctx, t, c);
        return c;
    };

    Tensor logits = s(DType::f32, {n, n_exp});  // [n, E] fp32 router logits
    Tensor idx = s(DType::i32, {n, k});         // [n, k] each token's experts, best first
    Tensor weight = s(DType::f32, {n, k});      // [n, k] their combine weights
    ops::router_logits(ctx, x, local.router, logits);
    ops::moe_route(
        ctx, route_rule(cfg), logits, m.correction_bias ? local.bias : Tensor{}, idx, weight);
    const Tensor xc = in_act(x);  // [n, d]
    Tensor z = xc;                // [n, w] the experts' input
    if (latent) {
        z = s(local.act, {n, width});
        ops::linear(ctx, xc, local.fc1, z);
    }
    Tensor y_lat;  // [n, ℓ] f32 (latent)
    Tensor& acc = latent ? (y_lat = s(DType::f32, {n, width})) : y;
    const bool count = load && stats != nullptr;
    ops::moe_fused_experts(ctx,
                           idx,
                           weight,
                           z,
                           local.experts.gate,
                           local.experts.up,
                           local.experts.down,
                           acc,
                           count ? &one.tokens_per_expert : nullptr);
    if (latent)
        ops::linear(ctx, in_act(y_lat), local.fc2, y);
    if (m.n_shared_experts > 0) {               // y += Shared(x)
        Tensor shared = s(DType::f32, {n, d});  // [n, d]
        dense_ffn_forward(ctx, local.shared, m.expert_act, xc, shared, rows, lora_rows);
        ops::add_inplace(ctx, y, shared);
    }
    if (stats != nullptr)
        stats->add(one);
}

}  // namespace detail

}  // namespace hymoe::model
