// The MoE backward on a Ctx over views (model/moe_parallel.h moe_backward_parallel(ctx, ...)) on
// the CPU context: the routed and shared experts' adapters as factor views with gradient views
// (model/lora_views.h) give the host slots' dx, dA and dB (the MoeWeights overload), for SwiGLU
// and ReLU² experts, sigmoid and softmax routing, capacity dropping and LatentMoE; and the ops of
// backend/ops_moe_backward.h against hand-computed values.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "hymoe/backend/ops_moe_backward.h"
#include "hymoe/core/rng.h"
#include "hymoe/model/ffn.h"
#include "hymoe/model/lora.h"
#include "hymoe/model/moe_parallel.h"
#include "hymoe/model/weights.h"

namespace {

using namespace hymoe;
using namespace hymoe::model;

Buffer random_buffer(Shape shape, uint64_t seed) {
    Buffer b(DType::f32, std::move(shape));
    Philox(seed, 0, 0).fill_normal(b.ptr<float>(), b.view().numel(), 0.0f, 1.0f);
    return b;
}

// A slot with one trainable rank-2 adapter on W [out, in], B random, no dropout (the factor
// views have none).
LoraSlot random_slot(int64_t out, int64_t in, uint32_t stream) {
    LoraSlot slot;
    slot.adapters.push_back(make_lora_pair(out, in, 2, 0.75f, 61, stream, true));
    Philox(62, stream, 0)
        .fill_normal(slot.adapters[0].B.ptr<float>(), static_cast<size_t>(out * 2), 0.0f, 0.5f);
    return slot;
}

// max |a − b| / max(1, |b|).
float close(const Tensor& a, const Tensor& b) {
    float e = 0;
    for (int64_t i = 0; i < b.numel(); ++i)
        e = std::max(e,
                     std::abs(a.ptr<float>()[i] - b.ptr<float>()[i]) /
                         std::max(1.0f, std::abs(b.ptr<float>()[i])));
    return e;
}

struct Case {
    const char* name;
    Ffn ffn;
    ExpertAct act;
    Scoring scoring;
    double capacity_factor;
};

}  // namespace

BOOST_AUTO_TEST_SUITE(moe_backward_views)

BOOST_AUTO_TEST_CASE(factor_views_match_host_slots) {
    for (const Case& c :
         {Case{
              "sigmoid swiglu, capacity 0.75", Ffn::moe, ExpertAct::swiglu, Scoring::sigmoid, 0.75},
          Case{"softmax relu2", Ffn::moe, ExpertAct::relu2, Scoring::softmax, 0.0},
          Case{"latent swiglu", Ffn::latent_moe, ExpertAct::swiglu, Scoring::sigmoid, 0.0}}) {
        BOOST_TEST_CONTEXT(c.name) {
            ModelConfig cfg;
            cfg.model_type = "hymoe";
            cfg.hidden_size = 32;
            MoeConfig& m = cfg.moe;
            m.n_routed_experts = 8;
            m.top_k = 2;
            m.n_shared_experts = 1;
            m.moe_intermediate = 16;
            m.shared_intermediate = 16;
            m.latent_size = 16;
            m.scoring = c.scoring;
            m.correction_bias = c.scoring == Scoring::sigmoid;
            m.expert_act = c.act;
            m.capacity_factor = c.capacity_factor;
            const LayerSpec spec{Mixer::kda, false, c.ffn};
            MoeWeights w;
            TensorList list = ffn_tensors(cfg, spec, nullptr, &w);
            for (TensorSpec& s : list)
                if (s.init == Init::normal)
                    s.std = 1.0f / std::sqrt(static_cast<float>(s.shape[1]));
            Philox rng(5, 0, 0);
            init_random(list, rng);
            const bool swiglu = c.act == ExpertAct::swiglu;
            const int64_t width = c.ffn == Ffn::latent_moe ? m.latent_size : cfg.hidden_size;
            const int64_t inter = m.moe_intermediate, d = cfg.hidden_size;

            std::vector<LoraSlot> slots;  // every adapter, host slots
            slots.reserve(40);
            uint32_t stream = 0;
            auto slot = [&](int64_t out, int64_t in) {
                slots.push_back(random_slot(out, in, stream++));
                return &slots.back();
            };
            for (DenseFfnWeights& e : w.experts) {
                e.lora.gate = swiglu ? slot(inter, width) : nullptr;
                e.lora.up = slot(inter, width);
                e.lora.down = slot(width, inter);
            }
            w.shared.lora.gate = swiglu ? slot(m.shared_intermediate, d) : nullptr;
            w.shared.lora.up = slot(m.shared_intermediate, d);
            w.shared.lora.down = slot(d, m.shared_intermediate);

            const int64_t n = 11;
            const Buffer x = random_buffer({n, d}, 7), dy = random_buffer({n, d}, 8);
            Buffer want(DType::f32, {n, d}), got(DType::f32, {n, d});
            moe_backward(cfg, spec, w, x.view(), dy.view(), want.view());

            // The same adapters as factor views with gradient views.
            std::vector<Buffer> grads;  // [2 per slot] dA, dB
            grads.reserve(2 * slots.size());
            auto factors = [&](LoraSlot* s) {
                LoraSlotView v;
                if (s) {
                    const LoraPair& p = s->adapters[0];
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
            MoeWeightViews v = moe_views(w);
            v.experts.lora.clear();
            for (DenseFfnWeights& e : w.experts)
                v.experts.lora_views.push_back(
                    {factors(e.lora.gate), factors(e.lora.up), factors(e.lora.down)});
            v.shared.lora = nullptr;
            v.shared.lora_views = {factors(w.shared.lora.gate),
                                   factors(w.shared.lora.up),
                                   factors(w.shared.lora.down)};
            std::vector<int64_t> all(static_cast<size_t>(n));
            for (int64_t i = 0; i < n; ++i)
                all[static_cast<size_t>(i)] = i;
            const std::vector<LoraRowsView> rows = {
                {0, Tensor{all.data(), DType::i64, Device::cpu, {n}}}};
            Tensor got_t = got.view();
            moe_backward_parallel(backend::cpu_ctx(),
                                  cfg,
                                  spec,
                                  v,
                                  x.view(),
                                  dy.view(),
                                  got_t,
                                  MoeParallel{},
                                  nullptr,
                                  nullptr,
                                  &rows);

            BOOST_TEST(close(got.view(), want.view()) <= 1e-6f);
            size_t g = 0;
            int nonzero = 0;
            for (const LoraSlot& s : slots) {
                const LoraPair& p = s.adapters[0];
                BOOST_TEST(close(grads[g].view(), p.dA.view()) <= 1e-6f);
                BOOST_TEST(close(grads[g + 1].view(), p.dB.view()) <= 1e-6f);
                const float* b = p.dB.ptr<float>();
                nonzero += std::any_of(b, b + p.dB.view().numel(), [](float f) { return f != 0; });
                g += 2;
            }
            BOOST_TEST(nonzero >= 6);  // several experts' adapters took part
        }
    }
}

// Views whose expert lists are in another order (MoeWeightViews::expert_slot, as the GPU model
// holds an ep rank's experts) give the same dx bit for bit and the same load per expert.
BOOST_AUTO_TEST_CASE(expert_slots_map_the_lists) {
    ModelConfig cfg;
    cfg.model_type = "hymoe";
    cfg.hidden_size = 32;
    MoeConfig& m = cfg.moe;
    m.n_routed_experts = 8;
    m.top_k = 3;
    m.n_shared_experts = 0;
    m.moe_intermediate = 16;
    m.correction_bias = true;
    const LayerSpec spec{Mixer::kda, false, Ffn::moe};
    MoeWeights w;
    TensorList list = ffn_tensors(cfg, spec, nullptr, &w);
    for (TensorSpec& s : list)
        if (s.init == Init::normal)
            s.std = 1.0f / std::sqrt(static_cast<float>(s.shape[1]));
    Philox rng(15, 0, 0);
    init_random(list, rng);
    const int64_t n = 13, d = cfg.hidden_size;
    const Buffer x = random_buffer({n, d}, 17), dy = random_buffer({n, d}, 18);
    Buffer want(DType::f32, {n, d}), got(DType::f32, {n, d});
    Tensor want_t = want.view(), got_t = got.view();
    MoeCommStats want_stats, got_stats;
    const MoeWeightViews v = moe_views(w);
    moe_backward_parallel(
        backend::cpu_ctx(), cfg, spec, v, x.view(), dy.view(), want_t, MoeParallel{}, &want_stats);
    MoeWeightViews reversed = v;  // entry i holds expert E − 1 − i
    for (auto* l : {&reversed.experts.gate, &reversed.experts.up, &reversed.experts.down})
        std::reverse(l->begin(), l->end());
    std::reverse(reversed.experts.lora.begin(), reversed.experts.lora.end());
    for (int e = 0; e < 8; ++e)
        reversed.expert_slot.push_back(7 - e);
    moe_backward_parallel(backend::cpu_ctx(),
                          cfg,
                          spec,
                          reversed,
                          x.view(),
                          dy.view(),
                          got_t,
                          MoeParallel{},
                          &got_stats);
    BOOST_TEST(std::memcmp(got.view().data, want.view().data, want.view().bytes()) == 0);
    BOOST_TEST(got_stats.tokens_per_expert == want_stats.tokens_per_expert,
               boost::test_tools::per_element());
    int64_t load = 0;
    for (int64_t t : want_stats.tokens_per_expert)
        load += t;
    BOOST_TEST(load == n * m.top_k);  // no capacity: every slot computed
}

// The backward's expert-side ops on the CPU context, against hand-computed values.
BOOST_AUTO_TEST_CASE(ops_on_the_cpu) {
    const backend::Ctx cpu = backend::cpu_ctx();
    const int64_t k = 2;
    std::vector<int64_t> row = {1, -1, 0, 2};  // [n·k] n = 2
    const Tensor row_t{row.data(), DType::i64, Device::cpu, {4}};
    std::vector<float> x = {1, 2, 3, 4};           // [2, 2]
    std::vector<float> weight = {2, 5, -1, 0.5f};  // [n·k]
    const Tensor x_t{x.data(), DType::f32, Device::cpu, {2, 2}};
    const Tensor w_t{weight.data(), DType::f32, Device::cpu, {4}};
    Buffer in(DType::f32, {3, 2});
    Tensor in_t = in.view();
    ops::moe_gather_scaled(cpu, x_t, row_t, w_t, k, in_t);
    const std::vector<float> in_want = {-3, -4, 2, 4, 1.5f, 2};
    BOOST_TEST(std::vector<float>(in.ptr<float>(), in.ptr<float>() + 6) == in_want,
               boost::test_tools::per_element());

    Buffer dw(DType::f32, {2, 2});
    Tensor dw_t = dw.view();
    ops::moe_slot_dot(cpu, x_t, in.view(), row_t, k, dw_t);
    // slot 0: x row 0 · in row 1 = 2 + 8; slot 1 dropped; slot 2: x row 1 · in row 0 = −9 − 16;
    // slot 3: x row 1 · in row 2 = 4.5 + 8
    const std::vector<float> dw_want = {10, 0, -25, 12.5f};
    BOOST_TEST(std::vector<float>(dw.ptr<float>(), dw.ptr<float>() + 4) == dw_want,
               boost::test_tools::per_element());

    Buffer joined(DType::f32, {2, 4});
    Tensor joined_t = joined.view();
    ops::place_cols(cpu, x_t, 0, joined_t);
    ops::place_cols(cpu, dw.view(), 2, joined_t);
    const std::vector<float> joined_want = {1, 2, 10, 0, 3, 4, -25, 12.5f};
    BOOST_TEST(std::vector<float>(joined.ptr<float>(), joined.ptr<float>() + 8) == joined_want,
               boost::test_tools::per_element());
}

BOOST_AUTO_TEST_SUITE_END()
