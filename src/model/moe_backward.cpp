// The MoE layer backward, the only one (model/moe_parallel.h; one rank, moe_backward in
// model/ffn.h, is the same path with groups of one): the forward's ownership and
// routing recomputed on the owned rows (capacity drops included, per etp block), then the
// pipeline of moe_dispatch.cpp with the experts' backward as its expert stage:
//   owner:  payload row = [u | g] (u = x, g = dy; latent_moe: u = z = fc1 x, g = dy fc2), 2w wide;
//   expert: the hosted experts' forward recomputed on u and their backward for w_i · g (their
//           adapters accumulate), returned row = [Σ_slots d_u | dw of each slot], w + top_k wide
//           (with etp > 1 both are partials over the rank's slice of I);
//   owner:  d_u summed in ascending source-rank order, dw placed in its slot; latent_moe:
//           dx_own = dz fc1; the router backward on the owned rows (linear in dw, so an etp
//           slice's partial dw gives its partial dx);
// then the shared experts' backward (tp partial, every row) and one all-reduce over tp: it sums
// the etp partials and the shared partials and places every block's rows.
#include <algorithm>
#include <functional>
#include <vector>

#include "hymoe/backend/ops.h"
#include "hymoe/core/error.h"
#include "hymoe/core/timer.h"
#include "hymoe/model/moe_parallel.h"
#include "moe_dispatch.h"
#include "moe_experts.h"
#include "router.h"

namespace hymoe::model {

namespace {

// out [n, wa + wb] = [a | b] for a [n, wa], b [n, wb].
void join_columns(const Tensor& a, const Tensor& b, Tensor& out) {
    const int64_t n = a.dim(0), wa = a.dim(1), wb = b.dim(1);
    for (int64_t t = 0; t < n; ++t) {
        float* row = out.ptr<float>() + t * (wa + wb);
        std::copy_n(a.ptr<float>() + t * wa, wa, row);
        std::copy_n(b.ptr<float>() + t * wb, wb, row + wa);
    }
}

// a [n, wa], b [n, wb] = the columns of ab [n, wa + wb].
void split_columns(const Tensor& ab, Tensor& a, Tensor& b) {
    const int64_t n = ab.dim(0), wa = a.dim(1), wb = b.dim(1);
    for (int64_t t = 0; t < n; ++t) {
        const float* row = ab.ptr<float>() + t * (wa + wb);
        std::copy_n(row, wa, a.ptr<float>() + t * wa);
        std::copy_n(row + wa, wb, b.ptr<float>() + t * wb);
    }
}

// The routed part's backward on the owned rows: du [n_own, w] = Σ over kept slots of the experts'
// input gradients for w_i · g, dw [n_own·top_k] = g · Expert_i(u) (0 for dropped slots), both
// partials over this rank's etp slice.
void routed_backward_parallel(const ModelConfig& cfg,
                              const MoeWeights& local,
                              const Routing& r,
                              const Tensor& u,  // [n_own, w]
                              const Tensor& g,  // [n_own, w]
                              Tensor& du,       // [n_own, w] zero on entry
                              std::vector<float>& dw,
                              const MoeParallel& par,
                              MoeCommStats& s) {
    const MoeConfig& m = cfg.moe;
    const int64_t width = u.dim(1), k = m.top_k;
    Buffer payload(DType::f32, {u.dim(0), 2 * width});  // [n_own, 2w] [u | g]
    join_columns(u, g, payload.view());
    dw.assign(static_cast<size_t>(u.dim(0) * k), 0.0f);
    auto experts = [&](detail::MoeBatch& b, const std::function<void()>& poll) {
        const int64_t n_recv = b.recv.view().dim(0);
        Buffer in(DType::f32, {n_recv, width});    // [n_recv, w] u rows
        Buffer grad(DType::f32, {n_recv, width});  // [n_recv, w] g rows
        Buffer d_in(DType::f32, {n_recv, width});  // [n_recv, w]
        Buffer d_weight(DType::f32, {n_recv, k});  // [n_recv, k]
        split_columns(b.recv.view(), in.view(), grad.view());
        const detail::RowSlots slots{
            b.recv_ids.ptr<int32_t>(), b.recv_weight.ptr<float>(), n_recv, k};
        detail::experts_backward(local,
                                 m.expert_act,
                                 slots,
                                 in.view(),
                                 grad.view(),
                                 d_in.view(),
                                 d_weight.ptr<float>(),
                                 poll,
                                 s.tokens_per_expert);
        join_columns(d_in.view(), d_weight.view(), b.partial.view());
    };
    auto owner = [&](const detail::MoeBatch& b) {
        detail::add_partials(b, du);
        const int32_t* ids = b.send_ids.ptr<int32_t>();  // [n_send, k]
        for (size_t row = 0; row < b.token.size(); ++row) {
            const float* back = b.back.ptr<float>() + static_cast<int64_t>(row) * (width + k);
            for (int64_t i = 0; i < k; ++i)  // each kept slot comes back from one rank only
                if (ids[static_cast<int64_t>(row) * k + i] >= 0)
                    dw[static_cast<size_t>(b.token[row] * k + i)] = back[width + i];
        }
    };
    detail::run_pipeline(detail::hosting_of(local, m.n_routed_experts, par.ep),
                         r,
                         k,
                         payload.view(),
                         width + k,
                         par,
                         s,
                         experts,
                         owner);
}

}  // namespace

void moe_backward_parallel(const ModelConfig& cfg,
                           const LayerSpec& spec,
                           const MoeWeights& local,
                           const Tensor& x,
                           const Tensor& dy,
                           Tensor& dx,
                           const MoeParallel& par,
                           MoeCommStats* stats) {
    detail::check_moe_layer(cfg, spec, local, x, dx, par);
    HYMOE_CHECK(dy.shape == x.shape && dx.data != dy.data,
                "moe_backward_parallel: dy ",
                shape_string(dy.shape),
                " for x ",
                shape_string(x.shape),
                " (dx must not alias dy)");
    const MoeConfig& m = cfg.moe;
    const int64_t n_tok = x.dim(0), d = cfg.hidden_size;
    const bool latent = spec.ffn == Ffn::latent_moe;
    const int tp = par.tp ? par.tp->size() : 1, tp_rank = par.tp ? par.tp->rank() : 0;
    MoeCommStats s;
    s.calls = 1;
    s.tokens_per_expert.assign(static_cast<size_t>(m.n_routed_experts), 0);

    // The forward's owned rows and routing; latent_moe dispatches z = fc1 x and dy fc2.
    const RowRange own = moe_owned_rows(n_tok, tp_rank, tp, par.etp);
    const Tensor x_own = x.rows(own.begin, own.count);    // [n_own, d]
    const Tensor dy_own = dy.rows(own.begin, own.count);  // [n_own, d]
    const int64_t width = latent ? m.latent_size : d;
    Buffer scores;  // [n_own, E]
    Routing r;
    Buffer z(DType::f32, {latent ? own.count : 0, width});       // [n_own, ℓ] latent_moe only
    Buffer dy_lat(DType::f32, {latent ? own.count : 0, width});  // [n_own, ℓ] latent_moe only
    {
        ScopedTimer timer(s.route_seconds);
        scores = detail::router_scores(cfg, local, x_own);
        r = detail::route_scores(cfg, local, scores.view());
        if (latent) {
            ops::linear(x_own, local.fc1_latent_proj.view(), z.view());
            detail::latent_output_backward(local.fc2_latent_proj.view(), dy_own, dy_lat.view());
        }
    }

    // Dispatch, experts' backward, combine: the owned rows' input-gradient partial and dw.
    std::fill(dx.ptr<float>(), dx.ptr<float>() + dx.numel(), 0.0f);
    Tensor dx_own = dx.rows(own.begin, own.count);           // [n_own, d]
    Buffer dz(DType::f32, {latent ? own.count : 0, width});  // [n_own, ℓ] latent_moe only
    std::vector<float> dw;                                   // [n_own·top_k]
    routed_backward_parallel(cfg,
                             local,
                             r,
                             latent ? z.view() : x_own,
                             latent ? dy_lat.view() : dy_own,
                             latent ? dz.view() : dx_own,
                             dw,
                             par,
                             s);
    {
        ScopedTimer timer(s.route_seconds);
        if (latent)
            detail::latent_input_backward(local.fc1_latent_proj.view(), dz.view(), dx_own);
        detail::router_backward(cfg, local, scores.view(), r, dw, dx_own);
    }

    // Shared experts' tp part on every row, then one all-reduce over tp.
    if (m.n_shared_experts > 0) {
        ScopedTimer timer(s.shared_seconds);
        Buffer shared(DType::f32, {n_tok, d});  // [n_tok, d]
        dense_ffn_backward(local.shared, m.expert_act, x, dy, shared.view());
        ops::add_inplace(dx, shared.view());
    }
    if (tp > 1) {
        ScopedTimer timer(s.reduce_seconds);
        comm::all_reduce(dx, *par.tp);
    }
    if (stats)
        stats->add(s);
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
