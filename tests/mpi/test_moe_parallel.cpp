// The expert-parallel MoE layer (hymoe/model/moe_parallel.h) against the one-rank moe_forward, at
// every layout of this world size (tp·dp = world, pp 1, ep·etp dividing tp·dp, etp | tp, ep | E):
// routed and latent MoE with shared experts, sigmoid scoring + correction bias, top_k 2 and 3,
// E 8, each dp replica with its own tokens (one replica with none), with and without overlap.
// Each rank slices the whole random weights itself, by the loader's contract. Also checked: the
// dispatch payload equals the analytic minimum for the routing, tokens_per_expert adds up to the
// one-rank routing's, overlap is bit-identical to no overlap under batch-invariant GEMMs,
// capacity dropping works per owner, and comm::all_to_all_v_start moves rows like all_to_all_v.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "../testing.h"
#include "hymoe/backend/ops.h"
#include "hymoe/core/rng.h"
#include "hymoe/model/ffn.h"
#include "hymoe/model/moe_parallel.h"
#include "hymoe/model/weights.h"
#include "hymoe/parallel/comms.h"

namespace {

using namespace hymoe;
using namespace hymoe::model;
using hymoe::parallel::Grid;
using hymoe::parallel::Layout;
using hymoe::testing::all_ranks;
using hymoe::testing::world_size;

constexpr int kExperts = 8;

// d 32, E 8, top_k 2 or 3, sigmoid + bias, renormalised, ρ 2.5, one shared expert of width 16;
// routed width 16 (so etp up to 8 still gets 2 columns), ℓ 16.
ModelConfig test_config(int top_k, ExpertAct act, double capacity_factor = 0.0) {
    ModelConfig c;
    c.model_type = "hymoe";
    c.hidden_size = 32;
    MoeConfig& m = c.moe;
    m.n_routed_experts = kExperts;
    m.top_k = top_k;
    m.n_shared_experts = 1;
    m.moe_intermediate = 16;
    m.shared_intermediate = 16;
    m.latent_size = 16;
    m.scoring = Scoring::sigmoid;
    m.correction_bias = true;
    m.routed_scaling_factor = 2.5;
    m.expert_act = act;
    m.capacity_factor = capacity_factor;
    return c;
}

// Whole weights at unit-variance scale (std = fan_in^{-1/2}); the same seed on every rank.
MoeWeights whole_weights(const ModelConfig& cfg, const LayerSpec& spec) {
    MoeWeights w;
    TensorList list = ffn_tensors(cfg, spec, nullptr, &w);
    for (TensorSpec& s : list)
        if (s.init == Init::normal)
            s.std = 1.0f / std::sqrt(static_cast<float>(s.shape[1]));
    Philox rng(1234, 0, 0);
    init_random(list, rng);
    return w;
}

// Rows or columns [part·n/parts, (part+1)·n/parts) of a 2-D buffer (an empty one stays empty).
Buffer slice(const Buffer& whole, int dim, int part, int parts) {
    const Tensor& t = whole.view();
    if (t.data == nullptr || t.numel() == 0)
        return Buffer();
    const int64_t rows = t.dim(0), cols = t.dim(1);
    const int64_t n = (dim == 0 ? rows : cols) / parts, at = part * n;
    Buffer out(DType::f32, dim == 0 ? Shape{n, cols} : Shape{rows, n});
    for (int64_t r = 0; r < out.view().dim(0); ++r)
        for (int64_t c = 0; c < out.view().dim(1); ++c)
            out.ptr<float>()[r * out.view().dim(1) + c] =
                dim == 0 ? t.ptr<float>()[(at + r) * cols + c] : t.ptr<float>()[r * cols + at + c];
    return out;
}

Buffer copy_of(const Buffer& whole) {
    const Tensor& t = whole.view();
    if (t.data == nullptr)
        return Buffer();
    Buffer out(t.dtype, t.shape);
    std::memcpy(out.view().data, t.data, t.bytes());
    return out;
}

// One MLP's part `part` of `parts`: gate/up rows, down columns.
DenseFfnWeights mlp_part(const DenseFfnWeights& w, int part, int parts) {
    return {slice(w.gate_proj, 0, part, parts),
            slice(w.up_proj, 0, part, parts),
            slice(w.down_proj, 1, part, parts),
            {}};
}

// What the loader gives this rank (the contract in moe_parallel.h), sliced here independently.
MoeWeights local_weights(const MoeWeights& whole, const Layout& l, const parallel::Coords& me) {
    MoeWeights w;
    w.gate = copy_of(whole.gate);
    w.correction_bias = copy_of(whole.correction_bias);
    w.fc1_latent_proj = copy_of(whole.fc1_latent_proj);
    w.fc2_latent_proj = copy_of(whole.fc2_latent_proj);
    w.experts.resize(whole.experts.size());
    const int per_rank = kExperts / l.ep;
    for (int e = me.ep * per_rank; e < (me.ep + 1) * per_rank; ++e)
        w.experts[static_cast<size_t>(e)] =
            mlp_part(whole.experts[static_cast<size_t>(e)], me.etp, l.etp);
    w.shared = mlp_part(whole.shared, me.tp, l.tp);
    return w;
}

// Every (tp, dp, pp 1, ep, etp) of this world with etp | tp and ep | E.
std::vector<Layout> moe_layouts(int world) {
    std::vector<Layout> out;
    for (int tp = 1; tp <= world; ++tp)
        for (int ep = 1; ep <= world; ++ep)
            for (int etp = 1; etp <= tp; ++etp)
                if (world % tp == 0 && tp % etp == 0 && world % (ep * etp) == 0 &&
                    kExperts % ep == 0)
                    out.push_back(Layout{tp, world / tp, 1, ep, etp});
    return out;
}

std::string describe(const Layout& l) {
    std::ostringstream s;
    s << "tp" << l.tp << " dp" << l.dp << " ep" << l.ep << " etp" << l.etp;
    return s.str();
}

// Each dp replica's own tokens: 13, 0, 9, 6, ... rows (replica 1 has none).
Buffer replica_tokens(int dp_rank, int64_t d) {
    const int64_t counts[] = {13, 0, 9, 6, 11, 4, 1, 8};
    const int64_t n_tok = counts[dp_rank % 8];
    Buffer x(DType::f32, {n_tok, d});  // [n_tok, d]
    Philox rng(99, 1, static_cast<uint32_t>(dp_rank));
    rng.fill_normal(x.ptr<float>(), static_cast<size_t>(x.view().numel()), 0.0f, 1.0f);
    return x;
}

// The rows [begin, end) an etp block owns, written out here (not moe_owned_rows).
std::pair<int64_t, int64_t> owned(int64_t n_tok, const Layout& l, int tp_rank) {
    const int64_t blocks = l.tp / l.etp, b = tp_rank / l.etp;
    const int64_t base = n_tok / blocks, extra = n_tok % blocks;
    const int64_t begin = b * base + std::min(b, extra);
    return {begin, begin + base + (b < extra ? 1 : 0)};
}

// max |a − b| / max |b| over n floats (0 for n = 0).
double relative_error(const float* a, const float* b, int64_t n) {
    double diff = 0, scale = 1e-30;
    for (int64_t i = 0; i < n; ++i) {
        diff = std::max(diff, static_cast<double>(std::abs(a[i] - b[i])));
        scale = std::max(scale, static_cast<double>(std::abs(b[i])));
    }
    return n == 0 ? 0.0 : diff / scale;
}

double world_max(double v) {
    MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return v;
}

// The analytic minimum payload of owned rows [begin, end): each token times the number of
// distinct ep ranks hosting its kept experts, × width × 4 bytes.
int64_t minimum_bytes(const Routing& r, int top_k, int ep, int64_t begin, int64_t end, int64_t w) {
    int64_t rows = 0;
    for (int64_t t = begin; t < end; ++t) {
        std::set<int64_t> ranks;
        for (int i = 0; i < top_k; ++i)
            if (r.kept[static_cast<size_t>(t * top_k + i)])
                ranks.insert(r.idx[static_cast<size_t>(t * top_k + i)] / (kExperts / ep));
        rows += static_cast<int64_t>(ranks.size());
    }
    return rows * w * static_cast<int64_t>(sizeof(float));
}

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
