// make bench: one MoE layer forward and backward over MPI (model/moe_parallel.h) at the run's
// world size, on
// a mid-size config (the `mid` preset's d 1024, I 512, shared 512, with E 32 and top_k 4 so that
// E divides every ep here). Reports, asserts nothing. Layouts: pure ep over the dp replicas; ep
// with etp 2 inside tp 2 (even world sizes); a latent_moe layer (ℓ 512) under pure ep. Each dp
// replica routes its own random tokens (HYMOE_BENCH_TOKENS, default 512). Per layout:
//   layer      wall time of the layer (slowest rank, best of 3), without overlap
//   comm share (dispatch + combine) / (all phases) of MoeCommStats, averaged over ranks, without
//              and with overlap (exposed communication only)
//   overlap    layer time without / with MoeParallel::overlap (> 1: overlap helps). On a host
//              whose cores all run ranks, shared-memory MPI copies compete with the GEMMs for
//              the same cores, and each micro-batch re-reads every expert's weights, so expect
//              <= 1 there; the gain needs a network (or NCCL) doing the transfer on its own.
//   bytes      dispatched payload per owned token against the analytic minimum (Σ over owned
//              tokens of distinct ep ranks hosting its kept experts × width × 4) and against
//              one copy per chosen expert (top_k × width × 4)
//   backward   moe_backward_parallel's time (without overlap) against the forward's, and its
//              dispatch, combine and total (dispatch + combine) bytes against the forward's
// Weights are random (each rank draws only its own slice); the routing is the random gate's.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <vector>

#include <mpi.h>

#include "hymoe/core/rng.h"
#include "hymoe/core/timer.h"
#include "hymoe/model/config.h"
#include "hymoe/model/ffn.h"
#include "hymoe/model/moe_parallel.h"
#include "hymoe/parallel/comms.h"
#include "hymoe/parallel/mpi_env.h"

namespace {

using namespace hymoe;
using namespace hymoe::model;
using hymoe::parallel::Layout;

// Tokens per dp replica: HYMOE_BENCH_TOKENS, else 512 (64 rows per expert at top_k 4 of 32,
// 32 per micro-batch; overlap re-reads each expert's weights once per micro-batch).
int64_t bench_tokens() {
    const char* v = std::getenv("HYMOE_BENCH_TOKENS");
    return v ? std::atoll(v) : 512;
}
constexpr int kReps = 3;

ModelConfig bench_config() {
    ModelConfig c = preset_config("mid");
    c.moe.n_routed_experts = 32;
    c.moe.top_k = 4;
    c.moe.latent_size = 512;
    return c;
}

Buffer random_buffer(Shape shape, Philox& rng) {
    Buffer b(DType::f32, std::move(shape));
    const float std = 1.0f / std::sqrt(static_cast<float>(b.view().dim(-1)));
    rng.fill_normal(b.ptr<float>(), static_cast<size_t>(b.view().numel()), 0.0f, std);
    return b;
}

// An MLP's slice: gate/up [inter/parts, width], down [width, inter/parts].
DenseFfnWeights random_mlp(int64_t inter, int64_t width, int parts, Philox& rng) {
    return {random_buffer({inter / parts, width}, rng),
            random_buffer({inter / parts, width}, rng),
            random_buffer({width, inter / parts}, rng),
            {}};
}

// This rank's weights by the loader's contract; the router from one seed on every rank.
MoeWeights local_weights(const ModelConfig& cfg,
                         bool latent,
                         const Layout& l,
                         const parallel::Coords& me) {
    const MoeConfig& m = cfg.moe;
    const int64_t d = cfg.hidden_size, width = latent ? m.latent_size : d;
    Philox shared_rng(7, 0, 0);
    MoeWeights w;
    w.gate = random_buffer({m.n_routed_experts, d}, shared_rng);
    w.correction_bias = random_buffer({m.n_routed_experts}, shared_rng);
    if (latent) {
        w.fc1_latent_proj = random_buffer({width, d}, shared_rng);
        w.fc2_latent_proj = random_buffer({d, width}, shared_rng);
    }
    Philox rng(7, 1, static_cast<uint32_t>(me.ep * 64 + me.tp));
    w.experts.resize(static_cast<size_t>(m.n_routed_experts));
    const int per_rank = m.n_routed_experts / l.ep;
    for (int e = me.ep * per_rank; e < (me.ep + 1) * per_rank; ++e)
        w.experts[static_cast<size_t>(e)] = random_mlp(m.moe_intermediate, width, l.etp, rng);
    w.shared = random_mlp(m.shared_intermediate, d, l.tp, rng);
    return w;
}

double world_max(double v) {
    MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return v;
}
double world_sum(double v) {
    MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    return v;
}

// Best (over reps) of the slowest rank's layer time, forward, or backward when dy is given;
// stats of the best rep.
double time_layer(const ModelConfig& cfg,
                  const LayerSpec& spec,
                  const MoeWeights& w,
                  const Tensor& x,
                  const MoeParallel& par,
                  MoeCommStats& best_stats,
                  const Tensor* dy = nullptr) {
    Buffer out(DType::f32, x.shape);  // y, or dx
    double best = 1e30;
    for (int rep = 0; rep < kReps; ++rep) {
        MoeCommStats s;
        MPI_Barrier(MPI_COMM_WORLD);
        const double t0 = wall_seconds();
        if (dy)
            moe_backward_parallel(cfg, spec, w, x, *dy, out.view(), par, &s);
        else
            moe_forward_parallel(cfg, spec, w, x, out.view(), par, &s);
        const double t = world_max(wall_seconds() - t0);
        if (t < best) {
            best = t;
            best_stats = s;
        }
    }
    return best;
}

// Σ over this rank's owned tokens of distinct hosting ep ranks, from the one-rank router.
double minimum_rows(const ModelConfig& cfg, const MoeWeights& w, const Tensor& x_own, int ep) {
    const Routing r = route(cfg, w, x_own);
    const int64_t k = cfg.moe.top_k, per_rank = cfg.moe.n_routed_experts / ep;
    double rows = 0;
    for (int64_t t = 0; t < x_own.dim(0); ++t) {
        std::set<int64_t> ranks;
        for (int64_t i = 0; i < k; ++i)
            if (r.kept[static_cast<size_t>(t * k + i)])
                ranks.insert(r.idx[static_cast<size_t>(t * k + i)] / per_rank);
        rows += static_cast<double>(ranks.size());
    }
    return rows;
}

// (dispatch + combine) / the sum of every phase of the layer, on this rank.
double comm_share(const MoeCommStats& s) {
    const double comm = s.dispatch_seconds + s.combine_seconds;
    return comm /
           (comm + s.route_seconds + s.compute_seconds + s.shared_seconds + s.reduce_seconds);
}

void bench_layout(
    const ModelConfig& cfg, const Layout& l, bool latent, int64_t n_tok, int world_rank) {
    const LayerSpec spec{Mixer::kda, false, latent ? Ffn::latent_moe : Ffn::moe};
    parallel::Grid g = parallel::make_grid(l);
    const MoeWeights w = local_weights(cfg, latent, l, g.me);
    const int64_t d = cfg.hidden_size, width = latent ? cfg.moe.latent_size : d;
    Buffer x(DType::f32, {n_tok, d});  // [n_tok, d] this replica's tokens
    Philox rng(11, 2, static_cast<uint32_t>(g.me.dp));
    rng.fill_normal(x.ptr<float>(), static_cast<size_t>(x.view().numel()), 0.0f, 1.0f);

    Buffer dy(DType::f32, {n_tok, d});  // [n_tok, d] the output gradient
    rng.fill_normal(dy.ptr<float>(), static_cast<size_t>(dy.view().numel()), 0.0f, 1.0f);

    MoeCommStats plain, over, back;
    const double t_plain =
        time_layer(cfg, spec, w, x.view(), {&g.comms.tp, &g.comms.ep, l.etp, false}, plain);
    const double t_over =
        time_layer(cfg, spec, w, x.view(), {&g.comms.tp, &g.comms.ep, l.etp, true}, over);
    const double t_back = time_layer(
        cfg, spec, w, x.view(), {&g.comms.tp, &g.comms.ep, l.etp, false}, back, &dy.view());

    const RowRange own = moe_owned_rows(n_tok, g.me.tp, l.tp, l.etp);
    const double owned = world_sum(static_cast<double>(own.count));
    const double min_bytes =
        world_sum(minimum_rows(cfg, w, x.view().rows(own.begin, own.count), l.ep)) * width * 4;
    const double bytes = world_sum(static_cast<double>(plain.dispatch_bytes));
    const double per_expert_copy = static_cast<double>(cfg.moe.top_k * width * 4);
    const double combine = world_sum(static_cast<double>(plain.combine_bytes));
    const double back_dispatch = world_sum(static_cast<double>(back.dispatch_bytes));
    const double back_combine = world_sum(static_cast<double>(back.combine_bytes));
    const double share_plain = world_sum(comm_share(plain)) / l.world();
    const double share_over = world_sum(comm_share(over)) / l.world();
    if (world_rank != 0)
        return;
    std::printf(
        "  %-10s tp%d dp%d ep%d etp%d: layer %7.1f ms, dispatch+combine %4.1f%% of it"
        " (%.1f%% with overlap)\n",
        latent ? "latent_moe" : "moe",
        l.tp,
        l.dp,
        l.ep,
        l.etp,
        t_plain * 1e3,
        100 * share_plain,
        100 * share_over);
    std::printf(
        "             overlap: %.1f -> %.1f ms = %.2fx;  payload %.0f B/owned token = "
        "%.3f of the analytic minimum, %.2f of one copy per expert\n",
        t_plain * 1e3,
        t_over * 1e3,
        t_plain / t_over,
        bytes / owned,
        bytes / min_bytes,
        bytes / owned / per_expert_copy);
    std::printf(
        "             backward: %.1f ms = %.2fx the forward;  bytes vs the forward's: dispatch "
        "%.2fx, combine %.3fx, total %.3fx\n",
        t_back * 1e3,
        t_back / t_plain,
        back_dispatch / bytes,
        back_combine / combine,
        (back_dispatch + back_combine) / (bytes + combine));
}

}  // namespace

int main(int argc, char** argv) {
    parallel::MpiEnv mpi(&argc, &argv);
    const int n = parallel::world_size(), rank = parallel::world_rank();
    const ModelConfig cfg = bench_config();
    const int64_t n_tok = bench_tokens();
    if (rank == 0)
        std::printf(
            "moe bench, %d ranks: d %d, E %d, top_k %d, I %d, shared %d, %lld tokens per "
            "dp replica (best of %d)\n",
            n,
            cfg.hidden_size,
            cfg.moe.n_routed_experts,
            cfg.moe.top_k,
            cfg.moe.moe_intermediate,
            cfg.moe.shared_intermediate,
            static_cast<long long>(n_tok),
            kReps);
    bench_layout(cfg, Layout{1, n, 1, n, 1}, false, n_tok, rank);  // pure ep over the dp replicas
    if (n % 2 == 0)
        bench_layout(cfg, Layout{2, n / 2, 1, n / 2, 2}, false, n_tok, rank);  // etp 2 in tp 2
    bench_layout(cfg, Layout{1, n, 1, n, 1}, true, n_tok, rank);               // latent payload
    return 0;
}
