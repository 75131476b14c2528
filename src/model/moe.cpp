// The MoE layer forward, the only one (model/moe_parallel.h), on a Ctx (CPU or GPU): token
// ownership inside the tp group, routing of the owned rows, the micro-batch pipeline of
// moe_dispatch.cpp (one batch, or two overlapped) with the hosted experts in the grouped form
// (moe_grouped.h) as its expert stage, then the assembly of y and the one tp all-reduce. One rank
// (moe_forward, model/ffn.h) is the same path with groups of one: every token owned, every expert
// hosted, the pipeline's dispatch handing the rows to itself; on a CUDA context, where
// moe_runs_fused allows, the fused kernels' branch (moe_fused.cpp) instead.
#include <algorithm>
#include <functional>
#include <utility>
#include <vector>

#include "hymoe/backend/moe_route.h"
#include "hymoe/backend/ops.h"
#include "hymoe/backend/ops_rows.h"
#include "hymoe/core/error.h"
#include "hymoe/core/timer.h"
#include "hymoe/model/moe_parallel.h"
#include "moe_dispatch.h"
#include "moe_experts.h"
#include "moe_fused.h"
#include "moe_grouped.h"
#include "router.h"

namespace hymoe::model {

RowRange moe_owned_rows(int64_t n_tok, int tp_rank, int tp, int etp) {
    HYMOE_CHECK(etp >= 1 && tp % etp == 0 && tp_rank >= 0 && tp_rank < tp,
                "tp ",
                tp,
                " (rank ",
                tp_rank,
                "), etp ",
                etp);
    const int64_t blocks = tp / etp, b = tp_rank / etp;
    const int64_t base = n_tok / blocks, extra = n_tok % blocks;
    return {b * base + std::min(b, extra), base + (b < extra ? 1 : 0)};
}

void MoeCommStats::add(const MoeCommStats& o) {
    calls += o.calls;
    dispatch_rows += o.dispatch_rows;
    dispatch_bytes += o.dispatch_bytes;
    combine_bytes += o.combine_bytes;
    self_rows += o.self_rows;
    route_seconds += o.route_seconds;
    dispatch_seconds += o.dispatch_seconds;
    compute_seconds += o.compute_seconds;
    combine_seconds += o.combine_seconds;
    shared_seconds += o.shared_seconds;
    reduce_seconds += o.reduce_seconds;
    if (tokens_per_expert.size() < o.tokens_per_expert.size())
        tokens_per_expert.resize(o.tokens_per_expert.size(), 0);
    for (size_t e = 0; e < o.tokens_per_expert.size(); ++e)
        tokens_per_expert[e] += o.tokens_per_expert[e];
}

namespace {

// Routed part of the owned rows: acc [n_own, w] f32 = Σ_i w_i · Expert_idx_i(payload) through
// the dispatch/experts/combine pipeline over ep, on ctx's device.
void routed_parallel(const backend::Ctx& ctx,
                     const ModelConfig& cfg,
                     const MoeWeightViews& local,
                     const Routing& r,
                     const Tensor& payload /*[n_own, w]*/,
                     Tensor& acc /*[n_own, w]*/,
                     const MoeParallel& par,
                     MoeCommStats& s,
                     const int* row_adapter /*[n_own] or null*/) {
    const MoeConfig& m = cfg.moe;
    const std::vector<int>& slot = local.expert_slot;  // [E] or empty
    auto experts = [&](detail::MoeBatch& b, const std::function<void()>& poll) {
        const int64_t n_recv = b.recv.view().dim(0);
        if (n_recv == 0)
            return;
        const int32_t* ids = b.recv_ids.ptr<int32_t>();  // [n_recv, k] global expert ids
        std::vector<int32_t> held;                       // [n_recv, k] as entries of the views
        std::vector<int64_t> load;                       // [slots] rows each entry ran on
        if (!slot.empty()) {
            held.assign(ids, ids + n_recv * m.top_k);
            for (int32_t& e : held)
                if (e >= 0) {
                    HYMOE_CHECK(slot[static_cast<size_t>(e)] >= 0,
                                "expert ",
                                e,
                                " reached a rank that does not host it");
                    e = slot[static_cast<size_t>(e)];
                }
            ids = held.data();
            load.assign(local.experts.up.size(), 0);
        }
        const detail::RowSlots slots{
            ids, b.recv_weight.ptr<float>(), n_recv, m.top_k, detail::received_adapters(b)};
        detail::experts_grouped(ctx,
                                local.experts,
                                m.expert_act,
                                slots,
                                b.recv.view(),
                                b.partial.view(),
                                poll,
                                slot.empty() ? s.tokens_per_expert : load);
        for (size_t e = 0; e < slot.size(); ++e)
            if (slot[e] >= 0)
                s.tokens_per_expert[e] += load[static_cast<size_t>(slot[e])];
    };
    auto owner = [&](const detail::MoeBatch& b) { detail::sum_partials(ctx, b, acc); };
    detail::run_pipeline(detail::hosting_of(local.expert_rank, m.n_routed_experts, par.ep),
                         r,
                         m.top_k,
                         payload,
                         payload.dim(1),
                         par,
                         s,
                         experts,
                         owner,
                         row_adapter,
                         ctx);
}

// The routing of x [n, d] f32 on ctx's device: logits by ops::router_logits, then on the host
// (router.h) the scores and the selection.
Routing route_rows(const backend::Ctx& ctx,
                   const ModelConfig& cfg,
                   const MoeWeightViews& w,
                   const Tensor& x) {
    const int64_t n = x.dim(0), n_exp = cfg.moe.n_routed_experts;
    Buffer scores(DType::f32, {n, n_exp}, uninit);  // [n, E] the logits, then s
    if (n > 0) {
        backend::Scratch scratch(ctx);
        Tensor logits = scratch(DType::f32, {n, n_exp});  // [n, E] on ctx's device
        ops::router_logits(ctx, x, w.router, logits);
        ops::download(ctx, logits, scores.view());
    }
    detail::router_activate(cfg, scores.view());
    return detail::route_scores(cfg, w.host_bias, scores.view());
}

}  // namespace

namespace detail {

void check_moe_layout(const ModelConfig& cfg,
                      const LayerSpec& spec,
                      int64_t n_slots,
                      const MoeParallel& par) {
    const MoeConfig& m = cfg.moe;
    const int tp = par.tp ? par.tp->size() : 1, ep = par.ep ? par.ep->size() : 1;
    HYMOE_CHECK(spec.ffn == Ffn::moe || spec.ffn == Ffn::latent_moe, "not an MoE layer");
    HYMOE_CHECK(
        n_slots == m.n_routed_experts, n_slots, " expert slots, config has ", m.n_routed_experts);
    HYMOE_CHECK(m.n_routed_experts % ep == 0 && par.etp >= 1 && tp % par.etp == 0,
                "E ",
                m.n_routed_experts,
                " over ep ",
                ep,
                ", etp ",
                par.etp,
                " in tp ",
                tp);
}

int64_t expert_slots(const MoeWeightViews& local) {
    return static_cast<int64_t>(local.expert_slot.empty() ? local.experts.up.size()
                                                          : local.expert_slot.size());
}

namespace {

// check_moe_layer for a layer whose weights name n_slots expert slots.
void check_layer(const ModelConfig& cfg,
                 const LayerSpec& spec,
                 int64_t n_slots,
                 const Tensor& x,
                 const Tensor& out,
                 const MoeParallel& par) {
    check_moe_layout(cfg, spec, n_slots, par);
    HYMOE_CHECK(x.shape.size() == 2 && x.dim(1) == cfg.hidden_size && out.shape == x.shape &&
                    out.data != x.data,
                "x ",
                shape_string(x.shape),
                " out ",
                shape_string(out.shape));
}

}  // namespace

void check_moe_layer(const ModelConfig& cfg,
                     const LayerSpec& spec,
                     const MoeWeights& local,
                     const Tensor& x,
                     const Tensor& out,
                     const MoeParallel& par) {
    check_layer(cfg, spec, static_cast<int64_t>(local.experts.size()), x, out, par);
}

}  // namespace detail

void moe_forward_parallel(const ModelConfig& cfg,
                          const LayerSpec& spec,
                          const MoeWeights& local,
                          const Tensor& x /*[n_tok, d]*/,
                          Tensor& y /*[n_tok, d]*/,
                          const MoeParallel& par,
                          MoeCommStats* stats,
                          const SeqBatch* rows,
                          Routing* routing_out) {
    moe_forward_parallel(
        backend::cpu_ctx(), cfg, spec, moe_views(local), x, y, par, stats, rows, routing_out);
}

void moe_forward_parallel(const backend::Ctx& ctx,
                          const ModelConfig& cfg,
                          const LayerSpec& spec,
                          const MoeWeightViews& local,
                          const Tensor& x /*[n_tok, d]*/,
                          Tensor& y /*[n_tok, d]*/,
                          const MoeParallel& par,
                          MoeCommStats* stats,
                          const SeqBatch* rows,
                          Routing* routing_out,
                          const std::vector<LoraRowsView>* lora_rows) {
    const MoeConfig& m = cfg.moe;
    detail::check_layer(cfg, spec, detail::expert_slots(local), x, y, par);
    const bool expert_adapters =
        !local.experts.lora.empty() ||
        (!local.experts.lora_views.empty() && lora_rows != nullptr && !lora_rows->empty());
    if (moe_runs_fused(ctx.device, cfg, spec, local.act, x.dim(0), par, expert_adapters)) {
        detail::moe_forward_fused(
            ctx, cfg, spec, local, x, y, par.fused_load, stats, rows, lora_rows);
        return;
    }
    const int64_t n_tok = x.dim(0), d = cfg.hidden_size;
    const bool latent = spec.ffn == Ffn::latent_moe;
    const int tp = par.tp ? par.tp->size() : 1, tp_rank = par.tp ? par.tp->rank() : 0;
    MoeCommStats s;
    s.calls = 1;
    s.tokens_per_expert.assign(static_cast<size_t>(m.n_routed_experts), 0);
    backend::Scratch scratch(ctx);

    // 1-2. The owned rows, routed; latent_moe dispatches z = fc1 x. The experts read local.act.
    const RowRange own = moe_owned_rows(n_tok, tp_rank, tp, par.etp);
    Tensor xc = x;  // [n_tok, d] x in local.act
    if (x.dtype != local.act) {
        xc = scratch(local.act, x.shape);
        ops::cast(ctx, x, xc);
    }
    const Tensor xc_own = xc.rows(own.begin, own.count);  // [n_own, d]
    const int64_t width = latent ? m.latent_size : d;
    Routing r;
    Tensor z = scratch(local.act, {latent ? own.count : 0, width});  // [n_own, ℓ] latent_moe
    {
        ScopedTimer timer(s.route_seconds);
        r = route_rows(ctx, cfg, local, x.rows(own.begin, own.count));
        if (latent && own.count > 0)
            ops::linear(ctx, xc_own, local.fc1, z);
    }

    // 3-5. Dispatch, experts, combine: the routed sum of the owned rows.
    ops::fill_zero(ctx, y);
    Tensor y_own = y.rows(own.begin, own.count);                          // [n_own, d]
    Tensor y_lat = scratch(DType::f32, {latent ? own.count : 0, width});  // [n_own, ℓ] latent
    Tensor acc = latent ? y_lat : y_own;
    const std::vector<int> token_adapter = rows ? row_adapters(*rows) : std::vector<int>();
    routed_parallel(ctx,
                    cfg,
                    local,
                    r,
                    latent ? z : xc_own,
                    acc,
                    par,
                    s,
                    token_adapter.empty() ? nullptr : token_adapter.data() + own.begin);
    if (latent && own.count > 0) {
        ScopedTimer timer(s.combine_seconds);
        ops::linear(ctx, y_lat, local.fc2, y_own);
    }

    // 6. Shared experts' tp part on every row, then one all-reduce over tp.
    if (m.n_shared_experts > 0 && n_tok > 0) {
        ScopedTimer timer(s.shared_seconds);
        Tensor shared = scratch(DType::f32, {n_tok, d});  // [n_tok, d]
        dense_ffn_forward(ctx, local.shared, m.expert_act, xc, shared, rows, lora_rows);
        ops::add_inplace(ctx, y, shared);
    }
    if (tp > 1) {
        ScopedTimer timer(s.reduce_seconds);
        ops::synchronize(ctx);
        comm::all_reduce(y, *par.tp);
    }
    if (stats)
        stats->add(s);
    if (routing_out)
        *routing_out = std::move(r);
}

void moe_forward(const ModelConfig& cfg,
                 const LayerSpec& spec,
                 const MoeWeights& w,
                 const Tensor& x,
                 Tensor& y,
                 Routing* routing_out,
                 const SeqBatch* rows) {
    moe_forward_parallel(cfg, spec, w, x, y, MoeParallel{}, nullptr, rows, routing_out);
}

}  // namespace hymoe::model
