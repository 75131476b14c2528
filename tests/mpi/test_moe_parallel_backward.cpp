// The expert-parallel MoE backward (hymoe/model/moe_parallel.h moe_backward_parallel) against the
// one-rank moe_backward on the whole weights, at every layout of this world size (tp·dp = world,
// pp 1, ep·etp dividing tp·dp, etp | tp, ep | E): routed MoE (SwiGLU, sigmoid + correction bias,
// top_k 3) and latent MoE (ReLU², softmax, top_k 2), with and without shared experts, with and
// without capacity dropping (then the reference runs per etp block, as the forward drops), with
// and without overlap, with LoRA adapters on every expert projection (one per expert, or one per
// projection shared by the layer's experts) and on the shared experts. Checked: dx on every rank
// against its replica's one-rank dx; each adapter gradient, summed over the groups lora_grads.h
// names for it (the caller's contract), against the one-rank gradient summed over the dp
// replicas; the payload (2× the forward's analytic minimum) and the returned bytes. With adapter
// dropout: bit-for-bit repeatable, equal to one rank where the rows of each expert come in the
// one-rank order (tp = ep = etp = 1), and at every layout the backward's masks are the forward's
// (y is linear in each down adapter's B, so Σ <dB, B> equals the change of ⟨dy, y⟩ when every
// such B is zeroed).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <deque>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "../testing.h"
#include "hymoe/core/rng.h"
#include "hymoe/model/ffn.h"
#include "hymoe/model/lora.h"
#include "hymoe/model/moe_parallel.h"
#include "hymoe/parallel/comms.h"
#include "moe_fixture.h"

namespace {

using namespace hymoe;
using namespace hymoe::model;
using namespace hymoe::testing::moe;
using hymoe::parallel::Grid;
using hymoe::parallel::Group;
using hymoe::parallel::Layout;
using hymoe::testing::all_ranks;
using hymoe::testing::world_size;

const LayerSpec moe_layer{Mixer::kda, false, Ffn::moe};
const LayerSpec latent_layer{Mixer::kda, false, Ffn::latent_moe};

// The two layer configs: routed (SwiGLU, sigmoid + bias, top_k 3) or latent (ReLU², softmax
// without bias, top_k 2); shared experts or none; capacity factor 0.6 or dropless.
ModelConfig layer_config(const LayerSpec& spec, bool shared, bool capacity) {
    const bool latent = spec.ffn == Ffn::latent_moe;
    ModelConfig cfg = test_config(
        latent ? 2 : 3, latent ? ExpertAct::relu2 : ExpertAct::swiglu, capacity ? 0.6 : 0.0);
    if (latent) {
        cfg.moe.scoring = Scoring::softmax;
        cfg.moe.correction_bias = false;
    }
    cfg.moe.n_shared_experts = shared ? 1 : 0;
    return cfg;
}

// Each dp replica's output gradient, the shape of its tokens.
Buffer replica_grads(int dp_rank, int64_t d) {
    Buffer dy = replica_tokens(dp_rank, d);
    Philox rng(98, 2, static_cast<uint32_t>(dp_rank));
    rng.fill_normal(dy.ptr<float>(), static_cast<size_t>(dy.view().numel()), 0.0f, 1.0f);
    return dy;
}

// ---- LoRA adapters on one layer, whole (one rank) and sliced (each rank) -----------------------

enum class Proj { gate, up, down };

// One adapted projection: of routed expert `expert` (−1: one adapter shared by the layer's
// experts) or of the shared experts.
struct Site {
    bool routed = true;
    int expert = -1;
    Proj proj = Proj::up;
};

struct LayerLora {
    std::vector<Site> sites;
    std::deque<LoraSlot> slots;      // stable addresses
    std::vector<LoraSlot*> slot_of;  // [sites] null where this rank holds none
};

const Buffer& weight_of(const DenseFfnWeights& w, Proj p) {
    return p == Proj::gate ? w.gate_proj : p == Proj::up ? w.up_proj : w.down_proj;
}

LoraSlot*& hook_of(DenseFfnWeights& w, Proj p) {
    return p == Proj::gate ? w.lora.gate : p == Proj::up ? w.lora.up : w.lora.down;
}

const DenseFfnWeights& mlp_of(const MoeWeights& w, const Site& s) {
    return s.routed ? w.experts[static_cast<size_t>(std::max(s.expert, 0))] : w.shared;
}

// Hooks slot into every MLP the site adapts that this MoeWeights holds.
void hook(MoeWeights& w, const Site& s, LoraSlot* slot) {
    if (!s.routed) {
        hook_of(w.shared, s.proj) = slot;
        return;
    }
    for (size_t e = 0; e < w.experts.size(); ++e)
        if ((s.expert < 0 || s.expert == static_cast<int>(e)) &&
            w.experts[e].up_proj.view().data != nullptr)
            hook_of(w.experts[e], s.proj) = slot;
}

// Whole adapters on every projection: each expert's own, or one per projection for all experts;
// and the shared experts'. A, B random (B too, so A has a gradient), dropout p.
LayerLora whole_lora(MoeWeights& w, const ModelConfig& cfg, bool per_expert, float dropout) {
    LayerLora lora;
    std::vector<Proj> projs = {Proj::up, Proj::down};
    if (cfg.moe.expert_act == ExpertAct::swiglu)
        projs.insert(projs.begin(), Proj::gate);
    for (int e = per_expert ? 0 : -1; e < (per_expert ? kExperts : 0); ++e)
        for (Proj p : projs)
            lora.sites.push_back({true, e, p});
    if (cfg.moe.n_shared_experts > 0)
        for (Proj p : projs)
            lora.sites.push_back({false, -1, p});
    for (size_t i = 0; i < lora.sites.size(); ++i) {
        const Site& s = lora.sites[i];
        const Shape shape = weight_of(mlp_of(w, s), s.proj).view().shape;  // [out, in]
        const auto stream = static_cast<uint32_t>(i);
        LoraSlot& slot = lora.slots.emplace_back();
        LoraPair& pair = slot.adapters.emplace_back(
            make_lora_pair(shape[0], shape[1], 2, 0.5f, 77, stream, true));
        Philox(78, stream, 0)
            .fill_normal(
                pair.B.ptr<float>(), static_cast<size_t>(pair.B.view().numel()), 0.0f, 0.5f);
        slot.dropout = dropout;
        slot.dropout_seed = 5;
        slot.dropout_stream = stream;
        lora.slot_of.push_back(&slot);
        hook(w, s, &slot);
    }
    return lora;
}

// Does the site's factor (A, or B) split over its group? The weight's cut: down splits its input
// (A's columns), gate and up their output (B's rows).
bool factor_split(const Site& s, bool is_a) {
    return is_a == (s.proj == Proj::down);
}

// (part, parts) of the site's cut on this rank: etp for routed experts, tp for shared ones.
std::pair<int, int> part_of(const Site& s, const Layout& l, const parallel::Coords& me) {
    return s.routed ? std::pair{me.etp, l.etp} : std::pair{me.tp, l.tp};
}

Buffer cut(
    const Buffer& whole, const Site& s, bool is_a, const Layout& l, const parallel::Coords& me) {
    if (!factor_split(s, is_a))
        return copy_of(whole);
    const auto [part, parts] = part_of(s, l, me);
    return slice(whole, is_a ? 1 : 0, part, parts);
}

// This rank's slices of the whole adapters (held where the rank holds the adapted weight), hooked
// into `local`, with zero gradients.
LayerLora local_lora(MoeWeights& local,
                     const LayerLora& whole,
                     const Layout& l,
                     const parallel::Coords& me) {
    LayerLora lora;
    lora.sites = whole.sites;
    for (size_t i = 0; i < whole.sites.size(); ++i) {
        const Site& s = whole.sites[i];
        if (s.routed && s.expert >= 0 &&
            local.experts[static_cast<size_t>(s.expert)].up_proj.view().data == nullptr) {
            lora.slot_of.push_back(nullptr);
            continue;
        }
        const LoraSlot& from = *whole.slot_of[i];
        LoraSlot& slot = lora.slots.emplace_back();
        slot.dropout = from.dropout;
        slot.dropout_seed = from.dropout_seed;
        slot.dropout_stream = from.dropout_stream;
        LoraPair& pair = slot.adapters.emplace_back();
        pair.A = cut(from.adapters[0].A, s, true, l, me);
        pair.B = cut(from.adapters[0].B, s, false, l, me);
        pair.scale = from.adapters[0].scale;
        pair.dA = Buffer(DType::f32, pair.A.view().shape);
        pair.dB = Buffer(DType::f32, pair.B.view().shape);
        lora.slot_of.push_back(&slot);
        hook(local, s, &slot);
    }
    return lora;
}

// The groups runtime/lora_grads.cpp sums a factor's gradient over (lora_grads.h): shared experts
// split over tp: dp; whole: tp, dp. Routed experts split over etp: edp; whole: etp, edp; a layer's
// one adapter for every expert: ep as well.
std::vector<Group> holders(const Site& s, bool is_a) {
    const bool split = factor_split(s, is_a);
    if (!s.routed)
        return split ? std::vector{Group::dp} : std::vector{Group::tp, Group::dp};
    std::vector<Group> g = split ? std::vector{Group::edp} : std::vector{Group::etp, Group::edp};
    if (s.expert < 0)
        g.push_back(Group::ep);
    return g;
}

// The factor's gradient summed over its holders (the caller's sum).
Buffer summed_gradient(const LayerLora& lora, size_t site, bool is_a, const Grid& g) {
    const LoraPair& p = lora.slot_of[site]->adapters[0];
    Buffer sum = copy_of(is_a ? p.dA : p.dB);
    for (Group group : holders(lora.sites[site], is_a))
        if (g.comms.of(group).size() > 1)
            comm::all_reduce(sum.view(), g.comms.of(group));
    return sum;
}

// max |v| over the whole gradients of every factor: the scale of the adapters' gradients.
double gradient_scale(const LayerLora& whole) {
    double scale = 0;
    for (const LoraSlot& slot : whole.slots)
        for (const Buffer* b : {&slot.adapters[0].dA, &slot.adapters[0].dB})
            for (int64_t i = 0; i < b->view().numel(); ++i)
                scale = std::max(scale, static_cast<double>(std::abs(b->ptr<float>()[i])));
    return scale;
}

// max over the world and every factor of the error of the summed local gradients against this
// rank's slices of the whole ones, relative to the factor's largest entry, or to 1e-3 of every
// factor's largest where the factor is smaller (an expert barely used: its fp32 rounding is
// relative to the layer's scale, not its own).
double gradient_error(const LayerLora& local, const LayerLora& whole, const Grid& g) {
    const double floor = 1e-3 * gradient_scale(whole);
    double err = 0;
    for (size_t i = 0; i < local.sites.size(); ++i) {
        if (!local.slot_of[i])
            continue;
        for (bool is_a : {true, false}) {
            const Buffer got = summed_gradient(local, i, is_a, g);
            const LoraPair& w = whole.slot_of[i]->adapters[0];
            const Buffer want = cut(is_a ? w.dA : w.dB, local.sites[i], is_a, g.layout, g.me);
            BOOST_REQUIRE(got.view().shape == want.view().shape);
            double diff = 0, size = floor;
            for (int64_t j = 0; j < got.view().numel(); ++j) {
                const float a = got.ptr<float>()[j], b = want.ptr<float>()[j];
                diff = std::max(diff, static_cast<double>(std::abs(a - b)));
                size = std::max(size, static_cast<double>(std::abs(b)));
            }
            err = std::max(err, diff / size);
        }
    }
    return world_max(err);
}

// ---- the one-rank reference -------------------------------------------------------------------

// moe_backward on the whole weights for every dp replica (the adapters' gradients summed over
// them); dx of this rank's replica. With capacity dropping, per etp block of the replica's rows.
Buffer reference_dx(const ModelConfig& cfg,
                    const LayerSpec& spec,
                    const MoeWeights& whole,
                    const Grid& g) {
    const Layout& l = g.layout;
    const int64_t d = cfg.hidden_size;
    Buffer mine;
    for (int rep = 0; rep < l.dp; ++rep) {
        const Buffer x = replica_tokens(rep, d), dy = replica_grads(rep, d);
        const int64_t n_tok = x.view().dim(0);
        Buffer dx(DType::f32, {n_tok, d});
        const int blocks = cfg.moe.capacity_factor > 0 ? l.tp / l.etp : 1;
        for (int b = 0; b < blocks; ++b) {
            const auto [begin, end] =
                blocks == 1 ? std::pair<int64_t, int64_t>{0, n_tok} : owned(n_tok, l, b * l.etp);
            Tensor rows = dx.view().rows(begin, end - begin);
            moe_backward(cfg,
                         spec,
                         whole,
                         x.view().rows(begin, end - begin),
                         dy.view().rows(begin, end - begin),
                         rows);
        }
        if (rep == g.me.dp)
            mine = std::move(dx);
    }
    return mine;
}

// Σ over the world of v.
double world_sum(double v) {
    MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    return v;
}

double dot(const Tensor& a, const Tensor& b) {
    double s = 0;
    for (int64_t i = 0; i < a.numel(); ++i)
        s += static_cast<double>(a.ptr<float>()[i]) * static_cast<double>(b.ptr<float>()[i]);
    return s;
}

// max |a − b| over n floats.
double max_abs_error(const float* a, const float* b, int64_t n) {
    double diff = 0;
    for (int64_t i = 0; i < n; ++i)
        diff = std::max(diff, static_cast<double>(std::abs(a[i] - b[i])));
    return diff;
}

struct Errors {
    double dx = 0, dx_abs = 0, grad = 0;  // relative, absolute (dx), relative (adapters)
};

// One case at one layout: the parallel backward against the reference; payload checks where
// dropless.
Errors check_case(
    const ModelConfig& cfg, const LayerSpec& spec, const Grid& g, bool overlap, bool per_expert) {
    const Layout& l = g.layout;
    const int64_t d = cfg.hidden_size, k = cfg.moe.top_k;
    MoeWeights whole = whole_weights(cfg, spec);
    MoeWeights local = local_weights(whole, l, g.me);
    const LayerLora whole_ad = whole_lora(whole, cfg, per_expert, 0.0f);
    const LayerLora local_ad = local_lora(local, whole_ad, l, g.me);
    const Buffer dx_ref = reference_dx(cfg, spec, whole, g);

    const Buffer x = replica_tokens(g.me.dp, d), dy = replica_grads(g.me.dp, d);
    const int64_t n_tok = x.view().dim(0);
    Buffer dx(DType::f32, {n_tok, d});
    MoeCommStats stats;
    moe_backward_parallel(cfg,
                          spec,
                          local,
                          x.view(),
                          dy.view(),
                          dx.view(),
                          {&g.comms.tp, &g.comms.ep, l.etp, overlap},
                          &stats);
    Errors e;
    e.dx = world_max(relative_error(dx.ptr<float>(), dx_ref.ptr<float>(), n_tok * d));
    e.dx_abs = world_max(max_abs_error(dx.ptr<float>(), dx_ref.ptr<float>(), n_tok * d));
    e.grad = gradient_error(local_ad, whole_ad, g);
    if (cfg.moe.capacity_factor == 0) {
        const int64_t width = spec.ffn == Ffn::latent_moe ? cfg.moe.latent_size : d;
        const auto [begin, end] = owned(n_tok, l, g.me.tp);
        const int64_t bytes =
            minimum_bytes(route(cfg, whole, x.view()), k, l.ep, begin, end, width);
        const int64_t rows = bytes / width / 4;
        BOOST_TEST(all_ranks(stats.dispatch_rows == rows && stats.dispatch_bytes == 2 * bytes &&
                             stats.combine_bytes == rows * (width + k) * 4 && stats.calls == 1));
    }
    return e;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(moe_parallel_backward)

// Every layout × {moe, latent} × shared experts or not × capacity or not × overlap or not ×
// per-expert or layer-shared expert adapters.
BOOST_AUTO_TEST_CASE(every_layout_matches_one_rank) {
    for (const Layout& l : moe_layouts(world_size())) {
        Grid g = parallel::make_grid(l);
        Errors worst;
        for (const LayerSpec* spec : {&moe_layer, &latent_layer})
            for (bool shared : {false, true})
                for (bool capacity : {false, true})
                    for (bool overlap : {false, true})
                        for (bool per_expert : {false, true}) {
                            const ModelConfig cfg = layer_config(*spec, shared, capacity);
                            const Errors e = check_case(cfg, *spec, g, overlap, per_expert);
                            BOOST_TEST_INFO(
                                describe(l)
                                << " " << to_string(spec->ffn) << (shared ? " shared" : "")
                                << (capacity ? " capacity" : "") << (overlap ? " overlap" : "")
                                << (per_expert ? " per-expert" : " layer-shared") << ": dx " << e.dx
                                << ", adapters " << e.grad);
                            BOOST_TEST((e.dx <= 1e-5 && e.grad <= 1e-5));
                            worst.dx = std::max(worst.dx, e.dx);
                            worst.dx_abs = std::max(worst.dx_abs, e.dx_abs);
                            worst.grad = std::max(worst.grad, e.grad);
                        }
        if (g.rank == 0)
            BOOST_TEST_MESSAGE(describe(l)
                               << ": dx max abs. error " << worst.dx_abs << " (rel. " << worst.dx
                               << "), adapter gradients rel. " << worst.grad);
    }
}

// With adapter dropout the backward repeats bit for bit at every layout; where every expert gets
// its rows in the one-rank order (tp = ep = etp = 1, no overlap) its masks are one rank's, and so
// are dx and the gradients.
BOOST_AUTO_TEST_CASE(dropout_repeats_and_is_one_rank_where_rows_keep_their_order) {
    for (const Layout& l : moe_layouts(world_size())) {
        Grid g = parallel::make_grid(l);
        for (const LayerSpec* spec : {&moe_layer, &latent_layer}) {
            const ModelConfig cfg = layer_config(*spec, true, false);
            const int64_t d = cfg.hidden_size;
            MoeWeights whole = whole_weights(cfg, *spec);
            MoeWeights local = local_weights(whole, l, g.me);
            const LayerLora whole_ad = whole_lora(whole, cfg, true, 0.3f);
            LayerLora local_ad = local_lora(local, whole_ad, l, g.me);
            const Buffer x = replica_tokens(g.me.dp, d), dy = replica_grads(g.me.dp, d);
            const int64_t n_tok = x.view().dim(0);
            const MoeParallel par{&g.comms.tp, &g.comms.ep, l.etp, false};
            Buffer dx(DType::f32, {n_tok, d}), again(DType::f32, {n_tok, d});
            moe_backward_parallel(cfg, *spec, local, x.view(), dy.view(), dx.view(), par);
            std::vector<Buffer> grads;  // the first call's gradients, then zeroed
            for (LoraSlot& slot : local_ad.slots)
                for (Buffer* b : {&slot.adapters[0].dA, &slot.adapters[0].dB}) {
                    grads.push_back(copy_of(*b));
                    std::fill(b->ptr<float>(), b->ptr<float>() + b->view().numel(), 0.0f);
                }
            moe_backward_parallel(cfg, *spec, local, x.view(), dy.view(), again.view(), par);
            bool same = std::memcmp(dx.ptr<float>(), again.ptr<float>(), dx.view().bytes()) == 0;
            size_t at = 0;
            for (const LoraSlot& slot : local_ad.slots)
                for (const Buffer* b : {&slot.adapters[0].dA, &slot.adapters[0].dB})
                    same = same &&
                           std::memcmp(
                               grads[at++].ptr<float>(), b->ptr<float>(), b->view().bytes()) == 0;
            BOOST_TEST_INFO(describe(l) << " " << to_string(spec->ffn) << ": repeats");
            BOOST_TEST(all_ranks(same));
            if (l.tp == 1 && l.ep == 1 && l.etp == 1) {
                const Buffer dx_ref = reference_dx(cfg, *spec, whole, g);
                // the second call's gradients, summed over the replicas, against one rank's
                const double dx_err =
                    world_max(relative_error(again.ptr<float>(), dx_ref.ptr<float>(), n_tok * d));
                const double grad_err = gradient_error(local_ad, whole_ad, g);
                BOOST_TEST_INFO(describe(l) << " " << to_string(spec->ffn) << ": dx " << dx_err
                                            << ", adapters " << grad_err);
                BOOST_TEST((dx_err <= 1e-5 && grad_err <= 1e-5));
            }
        }
    }
}

// The backward's dropout masks are the forward's at every layout: y is linear in the B factor of
// every down adapter (y = … + s·(drop(h) Aᵀ) Bᵀ), so with every such B zeroed, ⟨dy, y⟩ drops by
// exactly Σ ⟨dB, B⟩ over those factors (each slice counted once after the caller's sums, the
// replicas' ⟨dy, y⟩ added up). A mask that differs between the two passes breaks the equality.
BOOST_AUTO_TEST_CASE(dropout_masks_of_the_backward_are_the_forwards) {
    for (const Layout& l : moe_layouts(world_size())) {
        Grid g = parallel::make_grid(l);
        for (const LayerSpec* spec : {&moe_layer, &latent_layer})
            for (bool overlap : {false, true}) {
                const ModelConfig cfg = layer_config(*spec, true, false);
                const int64_t d = cfg.hidden_size;
                MoeWeights whole = whole_weights(cfg, *spec);
                MoeWeights local = local_weights(whole, l, g.me);
                const LayerLora whole_ad = whole_lora(whole, cfg, overlap, 0.3f);
                LayerLora local_ad = local_lora(local, whole_ad, l, g.me);
                const Buffer x = replica_tokens(g.me.dp, d), dy = replica_grads(g.me.dp, d);
                const int64_t n_tok = x.view().dim(0);
                const MoeParallel par{&g.comms.tp, &g.comms.ep, l.etp, overlap};
                Buffer y(DType::f32, {n_tok, d}), y0(DType::f32, {n_tok, d}),
                    dx(DType::f32, {n_tok, d});
                moe_forward_parallel(cfg, *spec, local, x.view(), y.view(), par);
                moe_backward_parallel(cfg, *spec, local, x.view(), dy.view(), dx.view(), par);
                double predicted = 0;  // Σ ⟨dB, B⟩ / copies over the down adapters
                for (size_t i = 0; i < local_ad.sites.size(); ++i) {
                    if (!local_ad.slot_of[i] || local_ad.sites[i].proj != Proj::down)
                        continue;
                    Buffer& b = local_ad.slot_of[i]->adapters[0].B;
                    int copies = 1;
                    for (Group group : holders(local_ad.sites[i], false))
                        copies *= g.comms.of(group).size();
                    predicted +=
                        dot(summed_gradient(local_ad, i, false, g).view(), b.view()) / copies;
                    std::fill(b.ptr<float>(), b.ptr<float>() + b.view().numel(), 0.0f);
                }
                predicted = world_sum(predicted);
                moe_forward_parallel(cfg, *spec, local, x.view(), y0.view(), par);
                const double change =
                    world_sum((dot(dy.view(), y.view()) - dot(dy.view(), y0.view())) / l.tp);
                BOOST_TEST_INFO(describe(l)
                                << " " << to_string(spec->ffn) << (overlap ? " overlap" : "")
                                << ": change " << change << ", predicted " << predicted);
                BOOST_TEST(std::abs(change - predicted) <= 1e-4 * std::abs(change));
                BOOST_TEST(std::abs(change) > 0.1);  // the adapters matter
            }
    }
}

// No tokens on any rank: every collective still matches up and dx stays [0, d].
BOOST_AUTO_TEST_CASE(no_tokens_anywhere) {
    const ModelConfig cfg = layer_config(latent_layer, true, false);
    MoeWeights whole = whole_weights(cfg, latent_layer);
    for (const Layout& l : moe_layouts(world_size())) {
        Grid g = parallel::make_grid(l);
        MoeWeights local = local_weights(whole, l, g.me);
        Buffer x(DType::f32, {0, cfg.hidden_size}), dy(DType::f32, {0, cfg.hidden_size});
        Buffer dx(DType::f32, {0, cfg.hidden_size});
        MoeCommStats stats;
        for (bool overlap : {false, true})
            moe_backward_parallel(cfg,
                                  latent_layer,
                                  local,
                                  x.view(),
                                  dy.view(),
                                  dx.view(),
                                  {&g.comms.tp, &g.comms.ep, l.etp, overlap},
                                  &stats);
        BOOST_TEST_INFO(describe(l));
        BOOST_TEST(
            all_ranks(stats.calls == 2 && stats.dispatch_bytes == 0 && stats.combine_bytes == 0));
    }
}

BOOST_AUTO_TEST_SUITE_END()
