// The MoE layer backward, the only one (model/moe_parallel.h), on a Ctx (CPU or GPU; one rank,
// moe_backward in model/ffn.h, is the same path with groups of one): the forward's ownership and
// routing recomputed on the owned rows (router logits on the device, the routing on the host as
// the forward's; capacity drops included, per etp block), then the pipeline of moe_dispatch.cpp
// with the experts' backward (moe_grouped_backward.h) as its expert stage:
//   owner:  payload row = [u | g] (u = x, g = dy; latent_moe: u = z = fc1 x, g = dy fc2), 2w wide;
//   expert: the hosted experts' forward recomputed on u and their backward for w_i · g (their
//           adapters accumulate), returned row = [Σ_slots d_u | dw of each slot], w + top_k wide
//           (with etp > 1 both are partials over the rank's slice of I);
//   owner:  d_u summed in ascending source-rank order, dw (brought to the host) placed in its
//           slot; latent_moe: dx_own = dz fc1; the router backward on the owned rows (linear in
//           dw, so an etp slice's partial dw gives its partial dx);
// then the shared experts' backward (tp partial, every row) and one all-reduce over tp: it sums
// the etp partials and the shared partials and places every block's rows.
#include <functional>
#include <vector>

#include "hymoe/backend/moe_route.h"
#include "hymoe/backend/ops.h"
#include "hymoe/backend/ops_attention.h"
#include "hymoe/backend/ops_backward.h"
#include "hymoe/backend/ops_moe_backward.h"
#include "hymoe/backend/ops_rows.h"
#include "hymoe/core/error.h"
#include "hymoe/core/timer.h"
#include "hymoe/model/moe_parallel.h"
#include "moe_dispatch.h"
#include "moe_grouped_backward.h"
#include "router.h"

namespace hymoe::model {

namespace {

// The views' entries of the received rows' experts [n_recv, k] (MoeWeightViews::expert_slot;
// ids themselves when it is empty), and the rows each entry ran on mapped back to the experts.
struct HeldSlots {
    const std::vector<int>& slot;  // [E] or empty
    std::vector<int32_t> held;     // [n_recv, k] entries of the views
    std::vector<int64_t> load;     // [entries] rows each entry ran on

    HeldSlots(const MoeWeightViews& w, const int32_t* ids, int64_t n_slots) : slot(w.expert_slot) {
        if (slot.empty())
            return;
        held.assign(ids, ids + n_slots);
        for (int32_t& e : held)
            if (e >= 0) {
                HYMOE_CHECK(slot[static_cast<size_t>(e)] >= 0,
                            "expert ",
                            e,
                            " reached a rank that does not host it");
                e = slot[static_cast<size_t>(e)];
            }
        load.assign(w.experts.up.size(), 0);
    }
    const int32_t* ids(const int32_t* global) const { return slot.empty() ? global : held.data(); }
    std::vector<int64_t>& counts(std::vector<int64_t>& per_expert) {
        return slot.empty() ? per_expert : load;
    }
    void add_to(std::vector<int64_t>& per_expert) const {
        for (size_t e = 0; e < slot.size(); ++e)
            if (slot[e] >= 0)
                per_expert[e] += load[static_cast<size_t>(slot[e])];
    }
};

// The routed part's backward on the owned rows: du [n_own, w] = Σ over kept slots of the experts'
// input gradients for w_i · g, dw [n_own·top_k] (host) = g · Expert_i(u) (0 for dropped slots),
// both partials over this rank's etp slice.
void routed_backward_parallel(const backend::Ctx& ctx,
                              const ModelConfig& cfg,
                              const MoeWeightViews& local,
                              const Routing& r,
                              const Tensor& u,  // [n_own, w]
                              const Tensor& g,  // [n_own, w]
                              Tensor& du,       // [n_own, w] zero on entry
                              std::vector<float>& dw,
                              const MoeParallel& par,
                              MoeCommStats& s,
                              const int* row_adapter /*[n_own] or null*/) {
    const MoeConfig& m = cfg.moe;
    const int64_t width = u.dim(1), k = m.top_k;
    backend::Scratch scratch(ctx);
    Tensor payload = scratch(DType::f32, {u.dim(0), 2 * width});  // [n_own, 2w] [u | g]
    ops::place_cols(ctx, u, 0, payload);
    ops::place_cols(ctx, g, width, payload);
    dw.assign(static_cast<size_t>(u.dim(0) * k), 0.0f);
    auto experts = [&](detail::MoeBatch& b, const std::function<void()>& poll) {
        const int64_t n_recv = b.recv.view().dim(0);
        if (n_recv == 0)
            return;
        backend::Scratch rows(ctx);
        Tensor in = rows(DType::f32, {n_recv, width});    // [n_recv, w] u rows
        Tensor grad = rows(DType::f32, {n_recv, width});  // [n_recv, w] g rows
        Tensor d_in = rows(DType::f32, {n_recv, width});  // [n_recv, w]
        Tensor d_weight = rows(DType::f32, {n_recv, k});  // [n_recv, k]
        ops::copy_cols(ctx, b.recv.view(), 0, in);
        ops::copy_cols(ctx, b.recv.view(), width, grad);
        HeldSlots held(local, b.recv_ids.ptr<int32_t>(), n_recv * k);
        const detail::RowSlots slots{held.ids(b.recv_ids.ptr<int32_t>()),
                                     b.recv_weight.ptr<float>(),
                                     n_recv,
                                     k,
                                     detail::received_adapters(b)};
        detail::experts_grouped_backward(ctx,
                                         local.experts,
                                         m.expert_act,
                                         slots,
                                         in,
                                         grad,
                                         d_in,
                                         d_weight,
                                         poll,
                                         held.counts(s.tokens_per_expert));
        held.add_to(s.tokens_per_expert);
        ops::place_cols(ctx, d_in, 0, b.partial.view());
        ops::place_cols(ctx, d_weight, width, b.partial.view());
    };
    auto owner = [&](const detail::MoeBatch& b) {
        const auto n_send = static_cast<int64_t>(b.token.size());
        backend::Scratch rows(ctx);
        Tensor d_part = rows(DType::f32, {n_send, width});  // [n_send, w] input-gradient partials
        ops::copy_cols(ctx, b.back.view(), 0, d_part);
        detail::sum_partials(ctx, b, d_part, du);
        Tensor d_weight = rows(DType::f32, {n_send, k});  // [n_send, k] the slots' dw
        ops::copy_cols(ctx, b.back.view(), width, d_weight);
        Buffer back(DType::f32, {n_send, k}, uninit);  // [n_send, k] on the host
        ops::download(ctx, d_weight, back.view());
        const int32_t* ids = b.send_ids.ptr<int32_t>();  // [n_send, k]
        for (int64_t row = 0; row < n_send; ++row)
            for (int64_t i = 0; i < k; ++i)  // each kept slot comes back from one rank only
                if (ids[row * k + i] >= 0)
                    dw[static_cast<size_t>(b.token[static_cast<size_t>(row)] * k + i)] =
                        back.ptr<float>()[row * k + i];
    };
    detail::run_pipeline(detail::hosting_of(local.expert_rank, m.n_routed_experts, par.ep),
                         r,
                         k,
                         payload,
                         width + k,
                         par,
                         s,
                         experts,
                         owner,
                         row_adapter,
                         ctx);
}

// The layer's arguments against each other (as the forward's): its layout (check_moe_layout),
// x, dy and dx [n_tok, d] f32, dx aliasing neither.
void check_backward(const ModelConfig& cfg,
                    const LayerSpec& spec,
                    const MoeWeightViews& local,
                    const Tensor& x,
                    const Tensor& dy,
                    const Tensor& dx,
                    const MoeParallel& par) {
    detail::check_moe_layout(cfg, spec, detail::expert_slots(local), par);
    HYMOE_CHECK(x.shape.size() == 2 && x.dim(1) == cfg.hidden_size && dy.shape == x.shape &&
                    dx.shape == x.shape && dx.data != x.data && dx.data != dy.data &&
                    x.dtype == DType::f32 && dy.dtype == DType::f32 && dx.dtype == DType::f32 &&
                    local.act == DType::f32,
                "moe_backward_parallel: x ",
                shape_string(x.shape),
                " dy ",
                shape_string(dy.shape),
                " dx ",
                shape_string(dx.shape),
                " (f32, the experts' inputs too; dx must not alias x or dy)");
}

}  // namespace

void moe_backward_parallel(const backend::Ctx& ctx,
                           const ModelConfig& cfg,
                           const LayerSpec& spec,
                           const MoeWeightViews& local,
                           const Tensor& x,
                           const Tensor& dy,
                           Tensor& dx,
                           const MoeParallel& par,
                           MoeCommStats* stats,
                           const SeqBatch* rows,
                           const std::vector<LoraRowsView>* lora_rows) {
    check_backward(cfg, spec, local, x, dy, dx, par);
    const MoeConfig& m = cfg.moe;
    const int64_t n_tok = x.dim(0), d = cfg.hidden_size;
    const bool latent = spec.ffn == Ffn::latent_moe;
    const int tp = par.tp ? par.tp->size() : 1, tp_rank = par.tp ? par.tp->rank() : 0;
    MoeCommStats s;
    s.calls = 1;
    s.tokens_per_expert.assign(static_cast<size_t>(m.n_routed_experts), 0);
    backend::Scratch scratch(ctx);

    // The forward's owned rows and routing; latent_moe dispatches z = fc1 x and dy fc2.
    const RowRange own = moe_owned_rows(n_tok, tp_rank, tp, par.etp);
    const Tensor x_own = x.rows(own.begin, own.count);    // [n_own, d]
    const Tensor dy_own = dy.rows(own.begin, own.count);  // [n_own, d]
    const int64_t width = latent ? m.latent_size : d;
    Buffer scores(DType::f32, {own.count, m.n_routed_experts}, uninit);  // [n_own, E] on the host
    Routing r;
    Tensor z = scratch(DType::f32, {latent ? own.count : 0, width});       // [n_own, ℓ] latent
    Tensor dy_lat = scratch(DType::f32, {latent ? own.count : 0, width});  // [n_own, ℓ] latent
    {
        ScopedTimer timer(s.route_seconds);
        if (own.count > 0) {
            Tensor logits = scratch(DType::f32, scores.view().shape);  // [n_own, E]
            ops::router_logits(ctx, x_own, local.router, logits);
            ops::download(ctx, logits, scores.view());
        }
        detail::router_activate(cfg, scores.view());
        r = detail::route_scores(cfg, local.host_bias, scores.view());
        if (latent && own.count > 0) {
            ops::linear(ctx, x_own, local.fc1, z);
            ops::linear_backward(ctx, dy_own, local.fc2, dy_lat);  // dy_lat = dy fc2
        }
    }

    // Dispatch, experts' backward, combine: the owned rows' input-gradient partial and dw.
    ops::fill_zero(ctx, dx);
    Tensor dx_own = dx.rows(own.begin, own.count);                     // [n_own, d]
    Tensor dz = scratch(DType::f32, {latent ? own.count : 0, width});  // [n_own, ℓ] latent_moe
    ops::fill_zero(ctx, dz);
    std::vector<float> dw;  // [n_own·top_k]
    const std::vector<int> token_adapter = rows ? row_adapters(*rows) : std::vector<int>();
    routed_backward_parallel(ctx,
                             cfg,
                             local,
                             r,
                             latent ? z : x_own,
                             latent ? dy_lat : dy_own,
                             latent ? dz : dx_own,
                             dw,
                             par,
                             s,
                             token_adapter.empty() ? nullptr : token_adapter.data() + own.begin);
    {
        ScopedTimer timer(s.route_seconds);
        if (latent && own.count > 0)
            ops::linear_backward(ctx, dz, local.fc1, dx_own);  // dx_own = dz fc1
        detail::router_backward(ctx, cfg, local.router, local.bias, scores.view(), r, dw, dx_own);
    }

    // Shared experts' tp part on every row, then one all-reduce over tp.
    if (m.n_shared_experts > 0 && n_tok > 0) {
        ScopedTimer timer(s.shared_seconds);
        Tensor shared = scratch(DType::f32, {n_tok, d});  // [n_tok, d]
        dense_ffn_backward(ctx, local.shared, m.expert_act, x, dy, shared, lora_rows);
        ops::add_inplace(ctx, dx, shared);
    }
    if (tp > 1) {
        ScopedTimer timer(s.reduce_seconds);
        ops::synchronize(ctx);
        comm::all_reduce(dx, *par.tp);
    }
    if (stats)
        stats->add(s);
}

void moe_backward_parallel(const ModelConfig& cfg,
                           const LayerSpec& spec,
                           const MoeWeights& local,
                           const Tensor& x,
                           const Tensor& dy,
                           Tensor& dx,
                           const MoeParallel& par,
                           MoeCommStats* stats) {
    detail::check_moe_layer(cfg, spec, local, x, dx, par);
    moe_backward_parallel(backend::cpu_ctx(), cfg, spec, moe_views(local), x, dy, dx, par, stats);
}

void moe_backward(const ModelConfig& cfg,
                  const LayerSpec& spec,
                  const MoeWeights& w,
                  const Tensor& x,
                  const Tensor& dy,
                  Tensor& dx) {
    moe_backward_parallel(cfg, spec, w, x, dy, dx, MoeParallel{});
}

}  // namespace hymoe::model
