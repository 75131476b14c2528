// Unit tests of the FFN backward passes (hymoe/model/ffn.h dense_ffn_backward, moe_backward;
// spec/model-math.md §9): dx against central finite differences of L = Σ dy ⊙ y for the dense
// SwiGLU and relu2 MLP (with and without adapters), the adapters' dA, dB on gate/up/down (B
// nonzero, one slot with dropout), the MoE layer under sigmoid + bias + group-limited routing,
// softmax scoring, Kimi's biased weights and ε, top-1 without renormalisation, ρ ≠ 1, shared
// experts, relu2 experts and capacity dropping under both policies, and LatentMoE; a layer-shared
// expert adapter's gradient against the sum of per-expert copies; the adapters as factor views
// (model/lora_views.h) against the host slots; and the torch autograd golden
// of tests/golden/gen_moe_backward.py. Finite differences run in fp32 forwards with the loss
// summed in double; MoE cases pick the first input seed whose routing (expert choice and kept
// slots) is the same at every x ± ε. Run from the repository root (the golden file is read by
// relative path).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "hymoe/core/rng.h"
#include "hymoe/io/h5.h"
#include "hymoe/model/ffn.h"
#include "hymoe/model/ffn_views.h"
#include "hymoe/model/lora.h"
#include "hymoe/model/weights.h"

namespace {

using namespace hymoe;
using namespace hymoe::model;

const LayerSpec moe_layer{Mixer::kda, false, Ffn::moe};
const LayerSpec latent_layer{Mixer::kda, false, Ffn::latent_moe};

constexpr float fd_eps = 1e-2f;  // central-difference step on unit-scale inputs and weights
constexpr float fd_rtol = 1e-3f;

Buffer random_buffer(Shape shape, float std, uint64_t seed, uint32_t stream) {
    Buffer b(DType::f32, std::move(shape));
    Philox(seed, stream, 0).fill_normal(b.ptr<float>(), b.view().numel(), 0.0f, std);
    return b;
}

Buffer clone(const Buffer& src) {
    Buffer b(src.view().dtype, src.view().shape);
    std::memcpy(b.ptr<float>(), src.ptr<float>(), src.view().bytes());
    return b;
}

// L = Σ dy ⊙ y in double.
double dot(const Tensor& a, const Tensor& b) {
    double s = 0.0;
    for (int64_t i = 0; i < a.numel(); ++i)
        s += double{a.ptr<float>()[i]} * double{b.ptr<float>()[i]};
    return s;
}

// max |got − want| / max |want|.
float rel_err(const float* got, const float* want, int64_t n) {
    float diff = 0.0f, scale = 0.0f;
    for (int64_t i = 0; i < n; ++i) {
        diff = std::max(diff, std::abs(got[i] - want[i]));
        scale = std::max(scale, std::abs(want[i]));
    }
    return diff / scale;
}

// Central differences of loss() over the n floats at p: (L(p + ε) − L(p − ε)) / 2ε. `ok`, when
// given, runs after each perturbed evaluation; false stops and returns an empty vector.
std::vector<float> finite_differences(float* p,
                                      int64_t n,
                                      const std::function<double()>& loss,
                                      const std::function<bool()>& ok = nullptr) {
    std::vector<float> g(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
        const float keep = p[i];
        p[i] = keep + fd_eps;
        const double up = loss();
        const bool up_ok = !ok || ok();
        p[i] = keep - fd_eps;
        const double down = loss();
        const bool down_ok = !ok || ok();
        p[i] = keep;
        if (!up_ok || !down_ok)
            return {};
        g[static_cast<size_t>(i)] = static_cast<float>((up - down) / (2.0 * double{fd_eps}));
    }
    return g;
}

// ---- dense MLP ---------------------------------------------------------------------------------

// One MLP of width inter on inputs of width `width`, std fan_in^{-1/2} (relu2: no gate).
DenseFfnWeights random_mlp(ExpertAct act, int64_t width, int64_t inter, uint64_t seed) {
    DenseFfnWeights w;
    const float s_in = 1.0f / std::sqrt(static_cast<float>(width));
    if (act == ExpertAct::swiglu)
        w.gate_proj = random_buffer({inter, width}, s_in, seed, 0);
    w.up_proj = random_buffer({inter, width}, s_in, seed, 1);
    w.down_proj =
        random_buffer({width, inter}, 1.0f / std::sqrt(static_cast<float>(inter)), seed, 2);
    return w;
}

// A slot with one trainable rank-2 adapter on W [out, in]; B random (init would make it zero).
LoraSlot random_slot(int64_t out, int64_t in, uint64_t seed, uint32_t stream, float dropout) {
    LoraSlot slot;
    slot.adapters.push_back(make_lora_pair(out, in, 2, 0.75f, seed, stream, true));
    Philox(seed, stream + 100, 0)
        .fill_normal(slot.adapters[0].B.ptr<float>(), static_cast<size_t>(out * 2), 0.0f, 0.5f);
    slot.dropout = dropout;
    slot.dropout_seed = seed + 1;
    slot.dropout_stream = stream;
    return slot;
}

// The adapters of one MLP: gate (swiglu only), up (with dropout 0.25), down.
struct MlpSlots {
    LoraSlot gate, up, down;
    MlpSlots(ExpertAct act, int64_t width, int64_t inter, uint64_t seed)
        : up(random_slot(inter, width, seed, 11, 0.25f)),
          down(random_slot(width, inter, seed, 12, 0.0f)) {
        if (act == ExpertAct::swiglu)
            gate = random_slot(inter, width, seed, 10, 0.0f);
    }
    void attach(ExpertAct act, DenseFfnWeights& w) {
        w.lora.gate = act == ExpertAct::swiglu ? &gate : nullptr;
        w.lora.up = &up;
        w.lora.down = &down;
    }
};

// An adapter matrix and its gradient buffer.
struct ParamGrad {
    Buffer* param;
    Buffer* grad;
    const char* what;
};

double dense_loss(const DenseFfnWeights& w, ExpertAct act, const Buffer& x, const Buffer& dy) {
    Buffer y(DType::f32, x.view().shape);  // [n, w]
    dense_ffn_forward(backend::cpu_ctx(), w, act, x.view(), y.view());
    return dot(dy.view(), y.view());
}

// ---- MoE ---------------------------------------------------------------------------------------

// The tiny MoE of test_moe.cpp (model-math §13): d 64, E 8, top-2, groups 2/1, sigmoid + bias,
// renormalised, ρ 2.5, one shared expert of width 32; ℓ 32 for latent layers.
ModelConfig tiny_moe() {
    ModelConfig c;
    c.model_type = "deepseek_v32";
    c.hidden_size = 64;
    MoeConfig& m = c.moe;
    m.n_routed_experts = 8;
    m.top_k = 2;
    m.n_shared_experts = 1;
    m.moe_intermediate = 32;
    m.shared_intermediate = 32;
    m.latent_size = 32;
    m.n_group = 2;
    m.topk_group = 1;
    m.routed_scaling_factor = 2.5;
    return c;
}

// Kimi-Linear's routing: one group, renormalised with + 1e-20, ρ 2.446, weights from s + b.
ModelConfig kimi_moe() {
    ModelConfig c = tiny_moe();
    c.model_type = "kimi_linear";
    c.moe.n_group = 1;
    c.moe.routed_scaling_factor = 2.446;
    c.moe.weights_from_biased_scores = true;
    return c;
}

// Weights at unit-variance scale (std = fan_in^{-1/2}, bias 0.1·N(0,1), as test_moe.cpp).
MoeWeights random_moe(const ModelConfig& cfg, const LayerSpec& spec, uint64_t seed) {
    MoeWeights w;
    TensorList list = ffn_tensors(cfg, spec, nullptr, &w);
    for (TensorSpec& s : list)
        if (s.init == Init::normal)
            s.std = 1.0f / std::sqrt(static_cast<float>(s.shape[1]));
    Philox rng(seed, 0, 0);
    init_random(list, rng);
    return w;
}

double moe_loss(const ModelConfig& cfg,
                const LayerSpec& spec,
                const MoeWeights& w,
                const Buffer& x,
                const Buffer& dy,
                Routing* r = nullptr) {
    Buffer y(DType::f32, x.view().shape);  // [n_tok, d]
    moe_forward(cfg, spec, w, x.view(), y.view(), r);
    return dot(dy.view(), y.view());
}

struct MoeCase {
    const char* name;
    ModelConfig cfg;
    LayerSpec spec;
};

std::vector<MoeCase> moe_cases() {
    std::vector<MoeCase> cases;
    cases.push_back({"deepseek sigmoid+bias+groups, rho 2.5, shared", tiny_moe(), moe_layer});
    ModelConfig soft = tiny_moe();
    soft.moe.scoring = Scoring::softmax;
    cases.push_back({"softmax+bias+groups", soft, moe_layer});
    ModelConfig soft_raw = soft;
    soft_raw.moe.renormalize = false;
    soft_raw.moe.n_group = 1;
    cases.push_back({"softmax, not renormalised", soft_raw, moe_layer});
    cases.push_back({"kimi biased weights, eps 1e-20", kimi_moe(), moe_layer});
    ModelConfig kimi_top1 = kimi_moe();
    kimi_top1.moe.top_k = 1;
    cases.push_back({"kimi top-1 (no renormalisation)", kimi_top1, moe_layer});
    ModelConfig relu2 = tiny_moe();
    relu2.moe.expert_act = ExpertAct::relu2;
    relu2.moe.renormalize = false;
    cases.push_back({"relu2 experts, not renormalised", relu2, moe_layer});
    for (DropPolicy policy : {DropPolicy::probs, DropPolicy::position}) {
        ModelConfig cap = tiny_moe();
        cap.moe.capacity_factor = 0.5;
        cap.moe.drop_policy = policy;
        cases.push_back(
            {policy == DropPolicy::probs ? "capacity 0.5, probs" : "capacity 0.5, position",
             cap,
             moe_layer});
    }
    ModelConfig latent = tiny_moe();
    latent.model_type = "hymoe";
    latent.moe.expert_act = ExpertAct::relu2;
    cases.push_back({"latent relu2", latent, latent_layer});
    latent.moe.expert_act = ExpertAct::swiglu;
    latent.moe.capacity_factor = 0.75;
    cases.push_back({"latent swiglu, capacity 0.75", latent, latent_layer});
    return cases;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(ffn_backward)

BOOST_AUTO_TEST_CASE(dense_dx_matches_finite_differences) {
    const int64_t n = 3, width = 16, inter = 24;
    for (ExpertAct act : {ExpertAct::swiglu, ExpertAct::relu2}) {
        for (bool adapters : {false, true}) {
            DenseFfnWeights w = random_mlp(act, width, inter, 1);
            MlpSlots slots(act, width, inter, 2);
            if (adapters)
                slots.attach(act, w);
            Buffer x = random_buffer({n, width}, 1.0f, 3, 0);   // [n, w]
            Buffer dy = random_buffer({n, width}, 1.0f, 4, 0);  // [n, w]
            Buffer dx(DType::f32, {n, width});                  // [n, w]
            dense_ffn_backward(w, act, x.view(), dy.view(), dx.view());
            const std::vector<float> fd = finite_differences(
                x.ptr<float>(), n * width, [&] { return dense_loss(w, act, x, dy); });
            const float err = rel_err(dx.ptr<float>(), fd.data(), n * width);
            BOOST_TEST_MESSAGE("dense " << to_string(act) << (adapters ? " + adapters" : "")
                                        << ": dx vs FD rel err " << err);
            BOOST_TEST(err <= fd_rtol);
        }
    }
}

BOOST_AUTO_TEST_CASE(dense_adapter_gradients_match_finite_differences) {
    const int64_t n = 4, width = 16, inter = 24;
    for (ExpertAct act : {ExpertAct::swiglu, ExpertAct::relu2}) {
        DenseFfnWeights w = random_mlp(act, width, inter, 5);
        MlpSlots slots(act, width, inter, 6);
        slots.attach(act, w);
        Buffer x = random_buffer({n, width}, 1.0f, 7, 0);   // [n, w]
        Buffer dy = random_buffer({n, width}, 1.0f, 8, 0);  // [n, w]
        Buffer dx(DType::f32, {n, width});                  // [n, w]
        dense_ffn_backward(w, act, x.view(), dy.view(), dx.view());
        for (LoraSlot* slot : {w.lora.gate, w.lora.up, w.lora.down}) {
            if (!slot)
                continue;
            LoraPair& p = slot->adapters[0];
            const std::vector<ParamGrad> params = {{&p.A, &p.dA, "A"}, {&p.B, &p.dB, "B"}};
            for (const auto& [param, grad, what] : params) {
                const int64_t count = param->view().numel();
                const std::vector<float> fd = finite_differences(
                    param->ptr<float>(), count, [&] { return dense_loss(w, act, x, dy); });
                const float err = rel_err(grad->ptr<float>(), fd.data(), count);
                const char* proj = slot == w.lora.gate ? "gate" : slot == w.lora.up ? "up" : "down";
                BOOST_TEST_MESSAGE("dense " << to_string(act) << " adapter " << proj << " d" << what
                                            << " vs FD rel err " << err);
                BOOST_TEST(err <= fd_rtol, proj << " d" << what);
            }
        }
    }
}

// The same adapters as factor views with gradient views (model/lora_views.h, adapter 0's rows
// all of them) give the host slots' dx, dA and dB through ops::lora_rows_backward.
BOOST_AUTO_TEST_CASE(dense_factor_views_match_host_slots) {
    const int64_t n = 5, width = 16, inter = 24;
    for (ExpertAct act : {ExpertAct::swiglu, ExpertAct::relu2}) {
        DenseFfnWeights w = random_mlp(act, width, inter, 9);
        LoraSlot gate = random_slot(inter, width, 10, 20, 0.0f),
                 up = random_slot(inter, width, 10, 21, 0.0f),
                 down = random_slot(width, inter, 10, 22, 0.0f);
        w.lora.gate = act == ExpertAct::swiglu ? &gate : nullptr;
        w.lora.up = &up;
        w.lora.down = &down;
        const Buffer x = random_buffer({n, width}, 1.0f, 11, 0);   // [n, w]
        const Buffer dy = random_buffer({n, width}, 1.0f, 12, 0);  // [n, w]
        Buffer dx(DType::f32, {n, width}), dx_views(DType::f32, {n, width});
        dense_ffn_backward(w, act, x.view(), dy.view(), dx.view());

        std::vector<Buffer> grads;  // the views' dA, dB, zero
        auto factors = [&](LoraSlot* slot) {
            LoraSlotView v;
            if (slot) {
                const LoraPair& p = slot->adapters[0];
                grads.emplace_back(DType::f32, p.A.view().shape);
                grads.emplace_back(DType::f32, p.B.view().shape);
                v.push_back({p.A.view(),
                             p.B.view(),
                             p.scale,
                             grads[grads.size() - 2].view(),
                             grads.back().view()});
            }
            return v;
        };
        grads.reserve(6);
        DenseFfnViews views = ffn_views(w);
        views.lora = nullptr;
        views.lora_views = {factors(w.lora.gate), factors(w.lora.up), factors(w.lora.down)};
        std::vector<int64_t> all(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i)
            all[static_cast<size_t>(i)] = i;
        const std::vector<LoraRowsView> rows = {
            {0, Tensor{all.data(), DType::i64, Device::cpu, {n}}}};
        Tensor dxv = dx_views.view();
        dense_ffn_backward(backend::cpu_ctx(), views, act, x.view(), dy.view(), dxv, &rows);

        auto close = [](const float* a, const float* b, int64_t count) {
            float e = 0;
            for (int64_t i = 0; i < count; ++i)
                e = std::max(e, std::abs(a[i] - b[i]) / std::max(1.0f, std::abs(b[i])));
            return e;
        };
        BOOST_TEST(close(dx_views.ptr<float>(), dx.ptr<float>(), n * width) <= 1e-6f);
        size_t g = 0;
        for (LoraSlot* slot : {w.lora.gate, w.lora.up, w.lora.down}) {
            if (!slot)
                continue;
            const LoraPair& p = slot->adapters[0];
            BOOST_TEST(close(grads[g].ptr<float>(), p.dA.ptr<float>(), p.dA.view().numel()) <=
                       1e-6f);
            BOOST_TEST(close(grads[g + 1].ptr<float>(), p.dB.ptr<float>(), p.dB.view().numel()) <=
                       1e-6f);
            g += 2;
        }
    }
}

BOOST_AUTO_TEST_CASE(moe_dx_matches_finite_differences) {
    const int64_t n_tok = 6;
    for (const MoeCase& c : moe_cases()) {
        const ModelConfig& cfg = c.cfg;
        const int64_t d = cfg.hidden_size;
        const MoeWeights w = random_moe(cfg, c.spec, 41);
        Buffer dy = random_buffer({n_tok, d}, 1.0f, 42, 0);  // [n_tok, d]
        bool done = false;
        for (uint64_t seed = 100; seed < 120 && !done; ++seed) {
            Buffer x = random_buffer({n_tok, d}, 1.0f, seed, 0);  // [n_tok, d]
            Routing base, moved;
            moe_loss(cfg, c.spec, w, x, dy, &base);
            if (cfg.moe.capacity_factor > 0.0 && base.dropped == 0)
                continue;  // the case is about dropping: want some
            const std::vector<float> fd = finite_differences(
                x.ptr<float>(),
                n_tok * d,
                [&] { return moe_loss(cfg, c.spec, w, x, dy, &moved); },
                [&] { return moved.idx == base.idx && moved.kept == base.kept; });
            if (fd.empty())
                continue;                       // the routing flips under ±ε: another input
            Buffer dx(DType::f32, {n_tok, d});  // [n_tok, d]
            moe_backward(cfg, c.spec, w, x.view(), dy.view(), dx.view());
            const float err = rel_err(dx.ptr<float>(), fd.data(), n_tok * d);
            BOOST_TEST_MESSAGE("moe " << c.name << " (input seed " << seed << ", dropped "
                                      << base.dropped << "): dx vs FD rel err " << err);
            BOOST_TEST(err <= fd_rtol, c.name);
            done = true;
        }
        BOOST_TEST(done, c.name << ": no input seed with a stable routing");
    }
}

BOOST_AUTO_TEST_CASE(layer_shared_expert_adapter_sums_over_experts) {
    ModelConfig cfg = tiny_moe();
    const int64_t n_tok = 8, d = cfg.hidden_size, inter = cfg.moe.moe_intermediate;
    const int64_t n_exp = cfg.moe.n_routed_experts;
    MoeWeights w = random_moe(cfg, moe_layer, 51);
    Buffer x = random_buffer({n_tok, d}, 1.0f, 52, 0);   // [n_tok, d]
    Buffer dy = random_buffer({n_tok, d}, 1.0f, 53, 0);  // [n_tok, d]
    Buffer dx(DType::f32, {n_tok, d});                   // [n_tok, d]

    // One up adapter shared by every routed expert, and one on the shared expert's down.
    LoraSlot shared_up = random_slot(inter, d, 54, 1, 0.0f);
    LoraSlot shared_down = random_slot(d, cfg.moe.shared_intermediate, 55, 2, 0.0f);
    for (DenseFfnWeights& e : w.experts)
        e.lora.up = &shared_up;
    w.shared.lora.down = &shared_down;
    moe_backward(cfg, moe_layer, w, x.view(), dy.view(), dx.view());
    const LoraPair& p = shared_up.adapters[0];

    // Each expert with its own copy of the adapter: the shared gradient is the sum of theirs.
    std::vector<LoraSlot> own(static_cast<size_t>(n_exp));
    for (int64_t e = 0; e < n_exp; ++e) {
        LoraPair q;
        q.A = clone(p.A);
        q.B = clone(p.B);
        q.scale = p.scale;
        q.dA = Buffer(DType::f32, p.A.view().shape);
        q.dB = Buffer(DType::f32, p.B.view().shape);
        own[e].adapters.push_back(std::move(q));
        w.experts[e].lora.up = &own[e];
    }
    w.shared.lora.down = nullptr;  // its gradient is complete
    moe_backward(cfg, moe_layer, w, x.view(), dy.view(), dx.view());
    w.shared.lora.down = &shared_down;
    int contributing = 0;
    for (auto [got, member] : {std::pair{&p.dA, &LoraPair::dA}, std::pair{&p.dB, &LoraPair::dB}}) {
        const int64_t count = got->view().numel();
        std::vector<float> sum(static_cast<size_t>(count), 0.0f);
        for (const LoraSlot& s : own) {
            const Buffer& g = s.adapters[0].*member;
            bool nonzero = false;
            for (int64_t i = 0; i < count; ++i) {
                sum[i] += g.ptr<float>()[i];
                nonzero = nonzero || g.ptr<float>()[i] != 0.0f;
            }
            contributing += nonzero ? 1 : 0;
        }
        const float err = rel_err(got->ptr<float>(), sum.data(), count);
        BOOST_TEST_MESSAGE("layer-shared adapter vs sum over experts: rel err " << err);
        BOOST_TEST(err <= 1e-5f);
    }
    BOOST_TEST(contributing >= 2 * 2);  // several experts take part (dA and dB each)

    // And the shared gradients are right: finite differences through every expert at once.
    for (DenseFfnWeights& e : w.experts)
        e.lora.up = &shared_up;
    const std::function<double()> loss = [&] { return moe_loss(cfg, moe_layer, w, x, dy); };
    for (LoraSlot* slot : {&shared_up, &shared_down}) {
        LoraPair& q = slot->adapters[0];
        const std::vector<ParamGrad> params = {{&q.A, &q.dA, "A"}, {&q.B, &q.dB, "B"}};
        for (const auto& [param, grad, what] : params) {
            const int64_t count = param->view().numel();
            const std::vector<float> fd = finite_differences(param->ptr<float>(), count, loss);
            const float err = rel_err(grad->ptr<float>(), fd.data(), count);
            BOOST_TEST_MESSAGE((slot == &shared_up ? "expert up" : "shared-expert down")
                               << " adapter d" << what << " vs FD rel err " << err);
            BOOST_TEST(err <= fd_rtol);
        }
    }
}

BOOST_AUTO_TEST_CASE(golden_torch_autograd_dx) {
    io::H5Reader h5("tests/golden/moe_backward.h5");
    const float rtol = h5.floats("rtol").at(0);
    BOOST_TEST(rtol <= 1e-4f);
    ModelConfig latent = tiny_moe();
    latent.model_type = "hymoe";
    latent.moe.expert_act = ExpertAct::relu2;
    ModelConfig soft = tiny_moe();
    soft.moe.scoring = Scoring::softmax;
    soft.moe.n_group = 1;
    const std::vector<MoeCase> cases = {{"deepseek", tiny_moe(), moe_layer},
                                        {"latent", latent, latent_layer},
                                        {"kimi", kimi_moe(), moe_layer},
                                        {"softmax", soft, moe_layer}};
    const char* prefixes[] = {"model.layers.1.mlp.",
                              "model.layers.3.mlp.",
                              "model.layers.1.block_sparse_moe.",
                              "model.layers.1.mlp."};
    for (size_t i = 0; i < cases.size(); ++i) {
        const MoeCase& c = cases[i];
        const std::string group = std::string(c.name) + "/";
        MoeWeights w;
        load_named(ffn_tensors(c.cfg, c.spec, nullptr, &w),
                   group + prefixes[i],
                   [&](const std::string& name, Tensor& dest) {
                       BOOST_REQUIRE_MESSAGE(h5.exists(name), name << " is not in moe_backward.h5");
                       BOOST_REQUIRE(h5.shape(name) == dest.shape);
                       const std::vector<float> v = h5.floats(name);
                       std::copy(v.begin(), v.end(), dest.ptr<float>());
                   });
        const Shape shape = h5.shape(group + "x");  // [n_tok, d]
        Buffer x(DType::f32, shape), dy(DType::f32, shape), dx(DType::f32, shape);
        const std::vector<float> x_v = h5.floats(group + "x"), dy_v = h5.floats(group + "dy");
        std::copy(x_v.begin(), x_v.end(), x.ptr<float>());
        std::copy(dy_v.begin(), dy_v.end(), dy.ptr<float>());
        BOOST_TEST(route(c.cfg, w, x.view()).idx == h5.ints(group + "idx"),
                   boost::test_tools::per_element());
        moe_backward(c.cfg, c.spec, w, x.view(), dy.view(), dx.view());
        const std::vector<float> want = h5.floats(group + "dx");
        const float err = rel_err(dx.ptr<float>(), want.data(), x.view().numel());
        BOOST_TEST_MESSAGE("golden " << c.name << ": dx vs torch autograd rel err " << err);
        BOOST_TEST(err <= rtol, c.name);
    }
}

BOOST_AUTO_TEST_SUITE_END()
