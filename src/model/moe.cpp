// The MoE layer forward, the only one (model/moe_parallel.h): token ownership inside the tp
// group, routing of the owned rows, the micro-batch pipeline of moe_dispatch.cpp (one batch, or
// two overlapped) with the hosted experts' forward as its expert stage, then the assembly of y and
// the one tp all-reduce. One rank (moe_forward, model/ffn.h) is the same path with groups of one:
// every token owned, every expert hosted, the pipeline's dispatch a copy to itself.
#include <algorithm>
#include <functional>
#include <utility>
#include <vector>

#include "hymoe/backend/ops.h"
#include "hymoe/core/error.h"
#include "hymoe/core/timer.h"
#include "hymoe/model/moe_parallel.h"
#include "moe_dispatch.h"
#include "moe_experts.h"

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

// Routed part of the owned rows: acc [n_own, w] += Σ_i w_i · Expert_idx_i(payload) through the
// dispatch/experts/combine pipeline over ep.
void routed_parallel(const ModelConfig& cfg,
                     const MoeWeights& local,
                     const Routing& r,
                     const Tensor& payload /*[n_own, w]*/,
                     Tensor& acc /*[n_own, w]*/,
                     const MoeParallel& par,
                     MoeCommStats& s,
                     const int* row_adapter /*[n_own] or null*/) {
    const MoeConfig& m = cfg.moe;
    auto experts = [&](detail::MoeBatch& b, const std::function<void()>& poll) {
        const detail::RowSlots slots{b.recv_ids.ptr<int32_t>(),
                                     b.recv_weight.ptr<float>(),
                                     b.recv.view().dim(0),
                                     m.top_k,
                                     detail::received_adapters(b)};
        detail::experts_forward(
            local, m.expert_act, slots, b.recv.view(), b.partial.view(), poll, s.tokens_per_expert);
    };
    auto owner = [&](const detail::MoeBatch& b) { detail::add_partials(b, acc); };
    detail::run_pipeline(detail::hosting_of(local, m.n_routed_experts, par.ep),
                         r,
                         m.top_k,
                         payload,
                         payload.dim(1),
                         par,
                         s,
                         experts,
                         owner,
                         row_adapter);
}

}  // namespace

namespace detail {

void check_moe_layer(const ModelConfig& cfg,
                     const LayerSpec& spec,
                     const MoeWeights& local,
                     const Tensor& x,
                     const Tensor& out,
                     const MoeParallel& par) {
    const MoeConfig& m = cfg.moe;
    const int tp = par.tp ? par.tp->size() : 1, ep = par.ep ? par.ep->size() : 1;
    HYMOE_CHECK(spec.ffn == Ffn::moe || spec.ffn == Ffn::latent_moe, "not an MoE layer");
    HYMOE_CHECK(x.shape.size() == 2 && x.dim(1) == cfg.hidden_size && out.shape == x.shape &&
                    out.data != x.data,
                "x ",
                shape_string(x.shape),
                " out ",
                shape_string(out.shape));
    HYMOE_CHECK(static_cast<int64_t>(local.experts.size()) == m.n_routed_experts,
                local.experts.size(),
                " expert slots, config has ",
                m.n_routed_experts);
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
    detail::check_moe_layer(cfg, spec, local, x, y, par);
    const MoeConfig& m = cfg.moe;
    const int64_t n_tok = x.dim(0), d = cfg.hidden_size;
    const bool latent = spec.ffn == Ffn::latent_moe;
    const int tp = par.tp ? par.tp->size() : 1, tp_rank = par.tp ? par.tp->rank() : 0;
    MoeCommStats s;
    s.calls = 1;
    s.tokens_per_expert.assign(static_cast<size_t>(m.n_routed_experts), 0);

    // 1-2. The owned rows, routed; latent_moe dispatches z = fc1 x.
    const RowRange own = moe_owned_rows(n_tok, tp_rank, tp, par.etp);
    const Tensor x_own = x.rows(own.begin, own.count);  // [n_own, d]
    const int64_t width = latent ? m.latent_size : d;
    Routing r;
    Buffer z(DType::f32, {latent ? own.count : 0, width});  // [n_own, ℓ] latent_moe only
    {
        ScopedTimer timer(s.route_seconds);
        r = route(cfg, local, x_own);
        if (latent)
            ops::linear(x_own, local.fc1_latent_proj.view(), z.view());
    }

    // 3-5. Dispatch, experts, combine: the routed sum of the owned rows.
    std::fill(y.ptr<float>(), y.ptr<float>() + y.numel(), 0.0f);
    Tensor y_own = y.rows(own.begin, own.count);                // [n_own, d]
    Buffer y_lat(DType::f32, {latent ? own.count : 0, width});  // [n_own, ℓ] latent_moe only
    Tensor acc = latent ? y_lat.view() : y_own;
    const std::vector<int> token_adapter = rows ? row_adapters(*rows) : std::vector<int>();
    routed_parallel(cfg,
                    local,
                    r,
                    latent ? z.view() : x_own,
                    acc,
                    par,
                    s,
                    token_adapter.empty() ? nullptr : token_adapter.data() + own.begin);
    if (latent) {
        ScopedTimer timer(s.combine_seconds);
        ops::linear(y_lat.view(), local.fc2_latent_proj.view(), y_own);
    }

    // 6. Shared experts' tp part on every row, then one all-reduce over tp.
    if (m.n_shared_experts > 0) {
        ScopedTimer timer(s.shared_seconds);
        Buffer shared(DType::f32, {n_tok, d});  // [n_tok, d]
        dense_ffn_forward(backend::cpu_ctx(), local.shared, m.expert_act, x, shared.view(), rows);
        ops::add_inplace(y, shared.view());
    }
    if (tp > 1) {
        ScopedTimer timer(s.reduce_seconds);
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
