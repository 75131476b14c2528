// The MoE layer's one backward (model/moe_parallel.h moe_backward_parallel on a Ctx) on a CUDA
// context against the same call on the CPU context with the same weights and adapters: sigmoid
// routing with a correction bias and capacity dropping (SwiGLU experts), softmax routing (ReLU²
// experts), and LatentMoE, each with a shared expert; every routed and shared projection carries
// a factor-view adapter with gradient views. fp32: dx and every dA, dB within 1e-5; the expert
// load equals the CPU's. The new ops of backend/ops_moe_backward.h against their CPU forms.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "cuda_test.h"
#include "hymoe/backend/ops_moe_backward.h"
#include "hymoe/core/rng.h"
#include "hymoe/model/ffn.h"
#include "hymoe/model/lora.h"
#include "hymoe/model/moe_parallel.h"
#include "hymoe/model/weights.h"

namespace utf = boost::unit_test;
using namespace hymoe;
using namespace hymoe::cuda_test;

namespace {

constexpr int64_t kExperts = 8;

struct Case {
    const char* name;
    model::Ffn ffn;
    model::ExpertAct act;
    model::Scoring scoring;
    double capacity_factor;
};

model::ModelConfig config(const Case& c) {
    model::ModelConfig cfg;
    cfg.model_type = "hymoe";
    cfg.hidden_size = 32;
    model::MoeConfig& m = cfg.moe;
    m.n_routed_experts = kExperts;
    m.top_k = 2;
    m.n_shared_experts = 1;
    m.moe_intermediate = 16;
    m.shared_intermediate = 16;
    m.latent_size = 16;
    m.scoring = c.scoring;
    m.correction_bias = c.scoring == model::Scoring::sigmoid;
    m.routed_scaling_factor = 2.5;
    m.expert_act = c.act;
    m.capacity_factor = c.capacity_factor;
    return cfg;
}

// The layer's views on one device: `up` copies a host tensor there (f32); the experts' matrices
// stacked [E, ·, ·] (ops::grouped_linear on CUDA); every projection's adapter as factors with
// zeroed gradients, in `grads` (host copies of the factors' values are the same on both devices).
struct LayerViews {
    model::MoeWeightViews v;
    std::vector<Tensor> grads;  // dA, dB of every adapter, in a fixed order
};

template <class Up>
LayerViews layer_views(const model::MoeWeights& w,
                       const std::vector<model::LoraPair>& pairs,
                       Up&& up) {
    LayerViews out;
    model::MoeWeightViews& v = out.v;
    v.router = up(w.gate.view());
    v.bias = up(w.correction_bias.view());
    v.host_bias = w.correction_bias.view();
    v.fc1 = up(w.fc1_latent_proj.view());
    v.fc2 = up(w.fc2_latent_proj.view());
    auto stacked = [&](Buffer model::DenseFfnWeights::*m) {
        std::vector<Tensor> slices;
        if ((w.experts[0].*m).view().data == nullptr)
            return slices;
        const Shape one = (w.experts[0].*m).view().shape;
        const int64_t each = one[0] * one[1];
        Buffer all(DType::f32, {kExperts, one[0], one[1]});
        for (int64_t e = 0; e < kExperts; ++e)
            std::memcpy(all.ptr<float>() + e * each,
                        (w.experts[static_cast<size_t>(e)].*m).view().data,
                        static_cast<size_t>(each) * sizeof(float));
        const Tensor d = up(all.view());
        for (int64_t e = 0; e < kExperts; ++e)
            slices.push_back(
                Tensor{static_cast<float*>(d.data) + e * each, DType::f32, d.device, one});
        return slices;
    };
    v.experts.gate = stacked(&model::DenseFfnWeights::gate_proj);
    v.experts.up = stacked(&model::DenseFfnWeights::up_proj);
    v.experts.down = stacked(&model::DenseFfnWeights::down_proj);
    v.shared.gate_proj = up(w.shared.gate_proj.view());
    v.shared.up_proj = up(w.shared.up_proj.view());
    v.shared.down_proj = up(w.shared.down_proj.view());
    size_t next = 0;
    auto factors = [&] {
        const model::LoraPair& p = pairs[next++];
        const Buffer zero_a(DType::f32, p.A.view().shape), zero_b(DType::f32, p.B.view().shape);
        out.grads.push_back(up(zero_a.view()));
        out.grads.push_back(up(zero_b.view()));
        return model::LoraSlotView{model::LoraFactorsView{up(p.A.view()),
                                                          up(p.B.view()),
                                                          p.scale,
                                                          out.grads[out.grads.size() - 2],
                                                          out.grads.back()}};
    };
    const bool swiglu = !v.experts.gate.empty();
    v.experts.lora_views.resize(kExperts);
    for (model::MlpLoraViews& e : v.experts.lora_views) {
        if (swiglu)
            e.gate = factors();
        e.up = factors();
        e.down = factors();
    }
    if (swiglu)
        v.shared.lora_views.gate = factors();
    v.shared.lora_views.up = factors();
    v.shared.lora_views.down = factors();
    return out;
}

// Every adapter's factors (B random: a fresh one would be zero), in layer_views' order.
std::vector<model::LoraPair> adapters(const model::ModelConfig& cfg, const model::LayerSpec& spec) {
    const model::MoeConfig& m = cfg.moe;
    const bool swiglu = m.expert_act == model::ExpertAct::swiglu;
    const int64_t width = spec.ffn == model::Ffn::latent_moe ? m.latent_size : cfg.hidden_size;
    std::vector<model::LoraPair> pairs;
    uint32_t stream = 0;
    auto add = [&](int64_t out, int64_t in) {
        pairs.push_back(model::make_lora_pair(out, in, 2, 0.75f, 77, stream, true));
        Philox(78, stream++, 0)
            .fill_normal(pairs.back().B.ptr<float>(), static_cast<size_t>(out * 2), 0.0f, 0.5f);
    };
    for (int64_t e = 0; e < kExperts; ++e) {
        if (swiglu)
            add(m.moe_intermediate, width);
        add(m.moe_intermediate, width);
        add(width, m.moe_intermediate);
    }
    if (swiglu)
        add(m.shared_intermediate, cfg.hidden_size);
    add(m.shared_intermediate, cfg.hidden_size);
    add(cfg.hidden_size, m.shared_intermediate);
    return pairs;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(cuda_moe_backward, *utf::label("cuda"))

BOOST_AUTO_TEST_CASE(moe_backward_on_cuda_equals_cpu, *utf::precondition(need_gpu)) {
    for (const Case& c : {Case{"sigmoid, bias, capacity 1",
                               model::Ffn::moe,
                               model::ExpertAct::swiglu,
                               model::Scoring::sigmoid,
                               1.0},
                          Case{"softmax, relu2",
                               model::Ffn::moe,
                               model::ExpertAct::relu2,
                               model::Scoring::softmax,
                               0.0},
                          Case{"latent_moe",
                               model::Ffn::latent_moe,
                               model::ExpertAct::swiglu,
                               model::Scoring::sigmoid,
                               0.0}}) {
        BOOST_TEST_CONTEXT(c.name) {
            const model::ModelConfig cfg = config(c);
            model::LayerSpec spec;
            spec.ffn = c.ffn;
            model::MoeWeights w;
            model::TensorList list = model::ffn_tensors(cfg, spec, nullptr, &w);
            for (model::TensorSpec& s : list)
                if (s.init == model::Init::normal)
                    s.std = 1.0f / std::sqrt(static_cast<float>(s.shape[1]));
            Philox rng(1234, 0, 0);
            model::init_random(list, rng);
            const std::vector<model::LoraPair> pairs = adapters(cfg, spec);
            const int64_t n = 19, d = cfg.hidden_size;
            const Buffer x = random({n, d}, 90, DType::f32);
            const Buffer dy = random({n, d}, 91, DType::f32);
            std::vector<int64_t> all(static_cast<size_t>(n));
            for (int64_t i = 0; i < n; ++i)
                all[static_cast<size_t>(i)] = i;

            // The CPU: the same call on the host's views.
            std::vector<Buffer> host;  // the host copies layer_views makes
            auto on_host = [&](const Tensor& t) {
                if (t.data == nullptr)
                    return Tensor{};
                host.emplace_back(t.dtype, t.shape);
                std::memcpy(host.back().view().data, t.data, t.bytes());
                return host.back().view();
            };
            host.reserve(256);
            const LayerViews cpu = layer_views(w, pairs, on_host);
            const std::vector<model::LoraRowsView> cpu_rows = {
                {0, Tensor{all.data(), DType::i64, Device::cpu, {n}}}};
            Buffer want(DType::f32, {n, d});
            Tensor want_t = want.view();
            model::MoeCommStats cpu_stats;
            model::moe_backward_parallel(backend::cpu_ctx(),
                                         cfg,
                                         spec,
                                         cpu.v,
                                         x.view(),
                                         dy.view(),
                                         want_t,
                                         model::MoeParallel{},
                                         &cpu_stats,
                                         nullptr,
                                         &cpu_rows);

            GpuCtx gc(16);
            const LayerViews gpu = layer_views(
                w, pairs, [&](const Tensor& t) { return t.data ? gc.up(t) : Tensor{}; });
            const std::vector<model::LoraRowsView> gpu_rows = {
                {0, to_device_i64(all, gc.g.arena, gc.g.s)}};
            Tensor dx = gc.f32({n, d});
            model::MoeCommStats stats;
            model::moe_backward_parallel(gc.ctx,
                                         cfg,
                                         spec,
                                         gpu.v,
                                         gc.up(x),
                                         gc.up(dy),
                                         dx,
                                         model::MoeParallel{},
                                         &stats,
                                         nullptr,
                                         &gpu_rows);
            expect_close("dx", dx, want, gc.g.s);
            for (size_t i = 0; i < cpu.grads.size(); ++i) {
                BOOST_TEST_INFO("adapter gradient " << i);
                Buffer cpu_grad(DType::f32, cpu.grads[i].shape);
                std::memcpy(cpu_grad.view().data, cpu.grads[i].data, cpu.grads[i].bytes());
                expect_close(i % 2 ? "dB" : "dA", gpu.grads[i], cpu_grad, gc.g.s);
            }
            BOOST_TEST(stats.tokens_per_expert == cpu_stats.tokens_per_expert,
                       boost::test_tools::per_element());
        }
    }
}

// The ops of the backward's expert side against their CPU forms: the scaled gather, the slots'
// dot products (dropped slots 0) and the column placement.
BOOST_AUTO_TEST_CASE(moe_backward_ops_equal_cpu, *utf::precondition(need_gpu)) {
    GpuCtx gc;
    const int64_t n = 7, k = 3, w = 45, n_rows = 12;
    const std::vector<int64_t> row = {0, -1, 1, 2,  3,  -1, 4,  5,  6,  -1, -1,
                                      7, 8,  9, -1, 10, -1, -1, 11, -1, -1};  // [n·k]
    const Buffer x = random({n, w}, 1, DType::f32);
    const Buffer weight = random({n * k}, 2, DType::f32);
    const Buffer out = random({n_rows, w}, 3, DType::f32);
    const Tensor row_h{const_cast<int64_t*>(row.data()), DType::i64, Device::cpu, {n * k}};
    const Tensor row_d = to_device_i64(row, gc.g.arena, gc.g.s);

    Buffer gathered(DType::f32, {n_rows, w});
    Tensor gathered_t = gathered.view();
    ops::moe_gather_scaled(backend::cpu_ctx(), x.view(), row_h, weight.view(), k, gathered_t);
    Tensor gathered_d = gc.f32({n_rows, w});
    ops::moe_gather_scaled(gc.ctx, gc.up(x), row_d, gc.up(weight), k, gathered_d);
    expect_close("moe_gather_scaled", gathered_d, gathered, gc.g.s);

    Buffer dw(DType::f32, {n, k});
    ops::moe_slot_dot(x.view(), out.view(), row_h, k, dw.view());
    Tensor dw_d = gc.f32({n, k});
    ops::moe_slot_dot(gc.ctx, gc.up(x), gc.up(out), row_d, k, dw_d);
    expect_close("moe_slot_dot", dw_d, dw, gc.g.s);
    BOOST_TEST(dw.ptr<float>()[1] == 0.0f);  // a dropped slot

    Buffer joined(DType::f32, {n, w + k});
    Tensor joined_t = joined.view();
    ops::place_cols(backend::cpu_ctx(), x.view(), 0, joined_t);
    ops::place_cols(backend::cpu_ctx(), dw.view(), w, joined_t);
    Tensor joined_d = gc.f32({n, w + k});
    ops::place_cols(gc.ctx, gc.up(x), 0, joined_d);
    ops::place_cols(gc.ctx, gc.up(dw), w, joined_d);
    expect_close("place_cols", joined_d, joined, gc.g.s);
}

BOOST_AUTO_TEST_SUITE_END()
