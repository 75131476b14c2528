// The expert-parallel MoE layer (hymoe/model/moe_parallel.h) against the one-rank moe_forward, at
// every layout of this world size (tp·dp = world, pp 1, ep·etp dividing tp·dp, etp | tp, ep | E):
// routed and latent MoE with shared experts, sigmoid scoring + correction bias, top_k 2 and 3,
// E 8, each dp replica with its own tokens (one replica with none), with and without overlap.
// Each rank slices the whole random weights itself, by the loader's contract. Also checked: the
// dispatch payload equals the analytic minimum for the routing, tokens_per_expert adds up to the
// one-rank routing's, overlap is bit-identical to no overlap under batch-invariant GEMMs,
// capacity dropping works per owner, and comm::all_to_all_v_start moves rows like all_to_all_v.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "../testing.h"
#include "hymoe/backend/ops.h"
#include "hymoe/model/ffn.h"
#include "hymoe/model/moe_parallel.h"
#include "hymoe/parallel/comms.h"
#include "moe_fixture.h"

namespace {

using namespace hymoe;
using namespace hymoe::model;
using hymoe::parallel::Grid;
using hymoe::parallel::Layout;
using hymoe::testing::all_ranks;
using hymoe::testing::world_size;
using namespace hymoe::testing::moe;

// For every etp rank j: Σ over the ranks with etp rank j of their tokens_per_expert equals Σ over
// dp replicas of the one-rank routing's (each assignment is computed once per etp slice).
bool tokens_add_up(const Grid& g,
                   const Layout& l,
                   const MoeCommStats& s,
                   const Routing& reference) {
    Buffer want(DType::i64, {kExperts});
    if (g.me.tp == 0)
        std::copy(reference.tokens_per_expert.begin(),
                  reference.tokens_per_expert.end(),
                  want.ptr<int64_t>());
    comm::all_reduce(want.view(), g.comms.world);
    bool ok = true;
    for (int j = 0; j < l.etp; ++j) {
        Buffer got(DType::i64, {kExperts});
        if (g.me.etp == j)
            std::copy(s.tokens_per_expert.begin(), s.tokens_per_expert.end(), got.ptr<int64_t>());
        comm::all_reduce(got.view(), g.comms.world);
        ok = ok &&
             std::equal(got.ptr<int64_t>(), got.ptr<int64_t>() + kExperts, want.ptr<int64_t>());
    }
    return ok;
}

// One layer at every layout, with and without overlap: y against moe_forward on the replica's
// tokens, the payload against the analytic minimum, tokens_per_expert against the routing.
void check_every_layout(const ModelConfig& cfg, const LayerSpec& spec) {
    const MoeWeights whole = whole_weights(cfg, spec);
    const int64_t d = cfg.hidden_size;
    const int64_t width = spec.ffn == Ffn::latent_moe ? cfg.moe.latent_size : d;
    for (const Layout& l : moe_layouts(world_size())) {
        Grid g = parallel::make_grid(l);
        const MoeWeights local = local_weights(whole, l, g.me);
        Buffer x = replica_tokens(g.me.dp, d);
        const int64_t n_tok = x.view().dim(0);
        Buffer y_ref(DType::f32, {n_tok, d});
        Routing routing;
        moe_forward(cfg, spec, whole, x.view(), y_ref.view(), &routing);
        const auto [begin, end] = owned(n_tok, l, g.me.tp);
        const int64_t bytes = minimum_bytes(routing, cfg.moe.top_k, l.ep, begin, end, width);
        for (bool overlap : {false, true}) {
            Buffer y(DType::f32, {n_tok, d});
            MoeCommStats stats;
            const MoeParallel par{&g.comms.tp, &g.comms.ep, l.etp, overlap};
            moe_forward_parallel(cfg, spec, local, x.view(), y.view(), par, &stats);
            const double err =
                world_max(relative_error(y.ptr<float>(), y_ref.ptr<float>(), n_tok * d));
            BOOST_TEST_INFO(describe(l) << (overlap ? " overlap" : "") << ": rel. error " << err);
            BOOST_TEST(err <= 1e-5);
            BOOST_TEST_INFO(describe(l) << (overlap ? " overlap" : "") << ": bytes");
            BOOST_TEST(all_ranks(stats.dispatch_bytes == bytes &&
                                 stats.dispatch_rows == bytes / width / 4 &&
                                 g.me.etp == g.me.tp % l.etp));
            BOOST_TEST_INFO(describe(l) << (overlap ? " overlap" : "") << ": tokens_per_expert");
            BOOST_TEST(tokens_add_up(g, l, stats, routing));
        }
    }
}

const LayerSpec moe_layer{Mixer::kda, false, Ffn::moe};
const LayerSpec latent_layer{Mixer::kda, false, Ffn::latent_moe};

}  // namespace

BOOST_AUTO_TEST_SUITE(moe_parallel)

BOOST_AUTO_TEST_CASE(all_to_all_v_start_moves_rows_like_all_to_all_v) {
    Grid g = parallel::make_grid(Layout{world_size(), 1, 1, 1, 1});
    const comm::Comm& c = g.comms.world;
    const int n = c.size(), r = c.rank();
    std::vector<int64_t> send_rows(static_cast<size_t>(n));
    int64_t sent = 0;
    for (int dst = 0; dst < n; ++dst)
        sent += send_rows[static_cast<size_t>(dst)] = (r + 2 * dst) % 3;
    Buffer in(DType::f32, {sent, 3});
    for (int64_t i = 0; i < sent * 3; ++i)
        in.ptr<float>()[i] = static_cast<float>(1000 * r + i);
    const std::vector<int64_t> recv_rows = comm::exchange_counts(send_rows, c);
    int64_t received = 0;
    for (int64_t v : recv_rows)
        received += v;
    Buffer blocking(DType::f32, {received, 3}), started(DType::f32, {received, 3});
    comm::all_to_all_v(in.view(), send_rows, blocking.view(), recv_rows, c);
    comm::Request req =
        comm::all_to_all_v_start(in.view(), send_rows, started.view(), recv_rows, c);
    while (!req.test()) {
    }
    req.wait();  // a completed request waits at once
    comm::Request moved = std::move(req);
    moved.wait();
    BOOST_TEST(all_ranks(
        std::memcmp(blocking.ptr<float>(), started.ptr<float>(), blocking.view().bytes()) == 0));
}

BOOST_AUTO_TEST_CASE(routed_moe_every_layout_matches_one_rank) {
    check_every_layout(test_config(3, ExpertAct::swiglu), moe_layer);
    check_every_layout(test_config(2, ExpertAct::swiglu), moe_layer);
}

BOOST_AUTO_TEST_CASE(latent_moe_every_layout_matches_one_rank) {
    check_every_layout(test_config(2, ExpertAct::relu2), latent_layer);
    check_every_layout(test_config(3, ExpertAct::swiglu), latent_layer);
}

// Under batch-invariant GEMMs a row's products do not depend on its batch, so splitting the
// owned rows into two overlapped micro-batches changes no bit of y.
BOOST_AUTO_TEST_CASE(overlap_is_bit_identical_under_batch_invariant_gemms) {
    const ModelConfig cfg = test_config(3, ExpertAct::swiglu);
    for (const LayerSpec& spec : {moe_layer, latent_layer}) {
        const MoeWeights whole = whole_weights(cfg, spec);
        for (const Layout& l : moe_layouts(world_size())) {
            Grid g = parallel::make_grid(l);
            const MoeWeights local = local_weights(whole, l, g.me);
            Buffer x = replica_tokens(g.me.dp, cfg.hidden_size);
            Buffer y0(DType::f32, x.view().shape), y1(DType::f32, x.view().shape);
            ops::set_batch_invariant(true);
            moe_forward_parallel(
                cfg, spec, local, x.view(), y0.view(), {&g.comms.tp, &g.comms.ep, l.etp, false});
            moe_forward_parallel(
                cfg, spec, local, x.view(), y1.view(), {&g.comms.tp, &g.comms.ep, l.etp, true});
            ops::set_batch_invariant(false);
            BOOST_TEST_INFO(describe(l) << " " << to_string(spec.ffn));
            BOOST_TEST(
                all_ranks(std::memcmp(y0.ptr<float>(), y1.ptr<float>(), y0.view().bytes()) == 0));
        }
    }
}

// Capacity (C from each block's owned rows, as documented): y equals moe_forward run on each
// block's rows separately.
BOOST_AUTO_TEST_CASE(capacity_dropping_is_per_owned_block) {
    const ModelConfig cfg = test_config(2, ExpertAct::swiglu, 0.6);
    const MoeWeights whole = whole_weights(cfg, moe_layer);
    const int64_t d = cfg.hidden_size;
    int64_t dropped = 0;
    for (const Layout& l : moe_layouts(world_size())) {
        Grid g = parallel::make_grid(l);
        const MoeWeights local = local_weights(whole, l, g.me);
        Buffer x = replica_tokens(g.me.dp, d);
        const int64_t n_tok = x.view().dim(0);
        Buffer y_ref(DType::f32, {n_tok, d}), y(DType::f32, {n_tok, d});
        for (int b = 0; b < l.tp / l.etp; ++b) {
            const auto [begin, end] = owned(n_tok, l, b * l.etp);
            Tensor rows = y_ref.view().rows(begin, end - begin);
            Routing r;
            moe_forward(cfg, moe_layer, whole, x.view().rows(begin, end - begin), rows, &r);
            dropped += r.dropped;
        }
        moe_forward_parallel(
            cfg, moe_layer, local, x.view(), y.view(), {&g.comms.tp, &g.comms.ep, l.etp, true});
        const double err = world_max(relative_error(y.ptr<float>(), y_ref.ptr<float>(), n_tok * d));
        BOOST_TEST_INFO(describe(l) << ": rel. error " << err);
        BOOST_TEST(err <= 1e-5);
    }
    BOOST_TEST(all_ranks(dropped > 0));  // the factor really drops something
}

// No tokens on any rank: every collective still matches up, y stays [0, d].
BOOST_AUTO_TEST_CASE(no_tokens_anywhere) {
    const ModelConfig cfg = test_config(2, ExpertAct::swiglu);
    const MoeWeights whole = whole_weights(cfg, latent_layer);
    for (const Layout& l : moe_layouts(world_size())) {
        Grid g = parallel::make_grid(l);
        const MoeWeights local = local_weights(whole, l, g.me);
        Buffer x(DType::f32, {0, cfg.hidden_size}), y(DType::f32, {0, cfg.hidden_size});
        MoeCommStats stats;
        for (bool overlap : {false, true})
            moe_forward_parallel(cfg,
                                 latent_layer,
                                 local,
                                 x.view(),
                                 y.view(),
                                 {&g.comms.tp, &g.comms.ep, l.etp, overlap},
                                 &stats);
        BOOST_TEST_INFO(describe(l));
        BOOST_TEST(all_ranks(stats.calls == 2 && stats.dispatch_bytes == 0 &&
                             stats.tokens_per_expert == std::vector<int64_t>(kExperts, 0)));
    }
}

BOOST_AUTO_TEST_SUITE_END()
