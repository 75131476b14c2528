// The MoE layer's one backward (model/moe_parallel.h moe_backward_parallel on a Ctx) on a CUDA
// context against the same call on the CPU context with the same weights and adapters: sigmoid
// routing with a correction bias and capacity dropping (SwiGLU experts), softmax routing (ReLU²
// experts), and LatentMoE, each with a shared expert; every routed and shared projection carries
// a factor-view adapter with gradient views. fp32 matrices: dx and every dA, dB within 1e-5; bf16
// matrices (the GPU trainer's, the CPU taking the same bf16 tensors) with fp32 activations: within
// kBf16Chain; the expert load equals the CPU's. The new ops of backend/ops_moe_backward.h against
// their CPU forms, and ops::grouped_linear's f32 rows of bf16 experts.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "cuda_test.h"
#include "hymoe/backend/ops.h"
#include "hymoe/backend/ops_moe.h"
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

// The bf16 layer's tolerance on the normalised error: on CUDA every product with a bf16 matrix
// rounds its f32 input rows to bf16 (relative error ≤ u = 2^-9 an element, where the CPU widens the
// matrix and keeps the rows), and dx's longest path runs k = 5 such products (the recomputed
// up/gate, down, then dh·W_down, d(up)·W_up): uncorrelated errors give about √k·u = 4.4e-3, bounded
// by 3√k·u.
const double kBf16Chain = 3 * std::sqrt(5.0) * std::ldexp(1.0, -9);

// The device result against the CPU's `want` within `tol` on the normalised error.
void expect_within(
    const char* what, const Tensor& dev, const Buffer& want, const cu::Stream& s, double tol) {
    Buffer got = to_host(dev, s);
    const double err = rel_error(got.ptr<float>(), want.ptr<float>(), want.view().numel());
    BOOST_TEST_INFO(what << ": normalised error " << err);
    BOOST_TEST(err < tol);
}

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

// The layer's views on one device: `up(t, dtype)` copies a host f32 tensor there as dtype; the
// matrices (fc1/fc2, the experts', the shared expert's) in `matrices`, the rest f32; the experts'
// matrices stacked [E, ·, ·] (ops::grouped_linear on CUDA); every projection's adapter as factors
// with zeroed gradients, in `grads` (host copies of the factors' values are the same on both
// devices).
struct LayerViews {
    model::MoeWeightViews v;
    std::vector<Tensor> grads;  // dA, dB of every adapter, in a fixed order
};

template <class Up>
LayerViews layer_views(const model::MoeWeights& w,
                       const std::vector<model::LoraPair>& pairs,
                       DType matrices,
                       Up&& up) {
    LayerViews out;
    model::MoeWeightViews& v = out.v;
    const DType f32 = DType::f32;
    v.router = up(w.gate.view(), f32);
    v.bias = up(w.correction_bias.view(), f32);
    v.host_bias = w.correction_bias.view();
    v.fc1 = up(w.fc1_latent_proj.view(), matrices);
    v.fc2 = up(w.fc2_latent_proj.view(), matrices);
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
        const Tensor d = up(all.view(), matrices);
        const auto bytes = each * static_cast<int64_t>(dtype_size(d.dtype));
        for (int64_t e = 0; e < kExperts; ++e)
            slices.push_back(
                Tensor{static_cast<char*>(d.data) + e * bytes, d.dtype, d.device, one});
        return slices;
    };
    v.experts.gate = stacked(&model::DenseFfnWeights::gate_proj);
    v.experts.up = stacked(&model::DenseFfnWeights::up_proj);
    v.experts.down = stacked(&model::DenseFfnWeights::down_proj);
    v.shared.gate_proj = up(w.shared.gate_proj.view(), matrices);
    v.shared.up_proj = up(w.shared.up_proj.view(), matrices);
    v.shared.down_proj = up(w.shared.down_proj.view(), matrices);
    size_t next = 0;
    auto factors = [&] {
        const model::LoraPair& p = pairs[next++];
        const Buffer zero_a(DType::f32, p.A.view().shape), zero_b(DType::f32, p.B.view().shape);
        out.grads.push_back(up(zero_a.view(), f32));
        out.grads.push_back(up(zero_b.view(), f32));
        return model::LoraSlotView{model::LoraFactorsView{up(p.A.view(), f32),
                                                          up(p.B.view(), f32),
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
                               0.0}})
        for (DType wt : {DType::f32, DType::bf16})
            BOOST_TEST_CONTEXT(c.name << ", " << to_string(wt) << " matrices") {
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

                // The CPU: the same call on the host's views (the matrices as bf16 tensors when
                // wt is: the CPU's own bf16 products).
                std::vector<Buffer> host;  // the host copies layer_views makes
                auto on_host = [&](const Tensor& t, DType dt) {
                    if (t.data == nullptr)
                        return Tensor{};
                    host.emplace_back(dt, t.shape);
                    Tensor h = host.back().view();
                    for (int64_t i = 0; i < t.numel(); ++i)
                        if (dt == DType::bf16)
                            h.ptr<uint16_t>()[i] = float_to_bf16(t.ptr<float>()[i]);
                        else
                            h.ptr<float>()[i] = t.ptr<float>()[i];
                    return h;
                };
                host.reserve(256);
                const LayerViews cpu = layer_views(w, pairs, wt, on_host);
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
                const LayerViews gpu = layer_views(w, pairs, wt, [&](const Tensor& t, DType dt) {
                    return t.data ? gc.up(t, dt) : Tensor{};
                });
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
                const double tol = wt == DType::bf16 ? kBf16Chain : tolerance(DType::f32);
                expect_within("dx", dx, want, gc.g.s, tol);
                for (size_t i = 0; i < cpu.grads.size(); ++i) {
                    BOOST_TEST_INFO("adapter gradient " << i);
                    Buffer cpu_grad(DType::f32, cpu.grads[i].shape);
                    std::memcpy(cpu_grad.view().data, cpu.grads[i].data, cpu.grads[i].bytes());
                    expect_within(i % 2 ? "dB" : "dA", gpu.grads[i], cpu_grad, gc.g.s, tol);
                }
                BOOST_TEST(stats.tokens_per_expert == cpu_stats.tokens_per_expert,
                           boost::test_tools::per_element());
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

// ops::grouped_linear's f32 rows of bf16 experts (the GPU trainer's MoE products) against the
// CPU's products with the same bf16 matrices: y f32, one rounding of the rows (tolerance(bf16)),
// an expert without rows in the middle; and the expert-by-expert batch-invariant form the same.
BOOST_AUTO_TEST_CASE(grouped_linear_f32_rows_of_bf16_experts, *utf::precondition(need_gpu)) {
    GpuCtx gc;
    const int64_t in = 72, out = 40;
    const std::vector<int64_t> counts = {5, 0, 9, 1};
    const auto n_exp = static_cast<int64_t>(counts.size());
    const int64_t n_rows = 15;
    const Buffer x = random({n_rows, in}, 7, DType::f32);
    const Buffer w32 = random({n_exp, out, in}, 8, DType::bf16);  // bf16 values
    Buffer w16(DType::bf16, {n_exp, out, in});
    for (int64_t i = 0; i < w32.view().numel(); ++i)
        w16.ptr<uint16_t>()[i] = float_to_bf16(w32.ptr<float>()[i]);
    std::vector<Tensor> host_w;
    for (int64_t e = 0; e < n_exp; ++e)
        host_w.push_back(
            Tensor{w16.ptr<uint16_t>() + e * out * in, DType::bf16, Device::cpu, {out, in}});
    Buffer want(DType::f32, {n_rows, out});
    Tensor want_t = want.view();
    ops::grouped_linear(backend::cpu_ctx(), x.view(), host_w, counts, want_t);

    const Tensor stack = gc.up(w32, DType::bf16);  // [E, out, in] bf16
    std::vector<Tensor> dev_w;
    for (int64_t e = 0; e < n_exp; ++e)
        dev_w.push_back(Tensor{static_cast<uint16_t*>(stack.data) + e * out * in,
                               DType::bf16,
                               stack.device,
                               {out, in}});
    const Tensor dx = gc.up(x);
    Tensor y = gc.f32({n_rows, out});
    ops::grouped_linear(gc.ctx, dx, dev_w, counts, y);
    expect_within("grouped_linear", y, want, gc.g.s, tolerance(DType::bf16));
    ops::set_batch_invariant(true);
    Tensor yi = gc.f32({n_rows, out});
    ops::grouped_linear(gc.ctx, dx, dev_w, counts, yi);
    ops::set_batch_invariant(false);
    expect_within("grouped_linear (batch-invariant)", yi, want, gc.g.s, tolerance(DType::bf16));
}

BOOST_AUTO_TEST_SUITE_END()
