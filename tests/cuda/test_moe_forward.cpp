// The MoE layer's one forward (model/moe_parallel.h moe_forward_parallel) on a CUDA context
// against model::moe_forward on the CPU with the same weights: routed SwiGLU experts with a
// correction bias, a shared expert and capacity dropping, and LatentMoE ReLU² experts without
// dropping, the experts' inputs in fp32 (within 1e-5) and bf16 (bf16 copies of the matrices, the
// CPU on the same rounded values; within 1e-2); the expert load equals the CPU routing's. Then
// the fused branch (moe_runs_fused: bf16 SwiGLU dropless layers at the kernels' widths, plain and
// LatentMoE, with a shared expert) against the CPU and against the generic path on the same
// device with fused turned off (MoeParallel::fused); its expert load only when asked.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "cuda_test.h"
#include "hymoe/backend/cuda_gemm.h"
#include "hymoe/core/rng.h"
#include "hymoe/model/ffn.h"
#include "hymoe/model/moe_parallel.h"
#include "hymoe/model/weights.h"

namespace utf = boost::unit_test;
using namespace hymoe;
using namespace hymoe::cuda_test;

namespace {

constexpr int64_t kExperts = 8;

model::ModelConfig config(model::ExpertAct act, double capacity_factor) {
    model::ModelConfig c;
    c.model_type = "hymoe";
    c.hidden_size = 32;
    model::MoeConfig& m = c.moe;
    m.n_routed_experts = kExperts;
    m.top_k = 2;
    m.n_shared_experts = 1;
    m.moe_intermediate = 16;
    m.shared_intermediate = 16;
    m.latent_size = 16;
    m.scoring = model::Scoring::sigmoid;
    m.correction_bias = true;
    m.routed_scaling_factor = 2.5;
    m.expert_act = act;
    m.capacity_factor = capacity_factor;
    return c;
}

// The stacked device copy [E, rows, cols] in t of expert matrix m, as its E slices.
std::vector<Tensor> stacked(const model::MoeWeights& w,
                            Buffer model::DenseFfnWeights::*m,
                            DType t,
                            Gpu& g) {
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
    const Tensor d = to_device(all.view(), t, g.arena, g.s);
    for (int64_t e = 0; e < kExperts; ++e)
        slices.push_back(
            Tensor{static_cast<char*>(d.data) + e * each * static_cast<int64_t>(dtype_size(t)),
                   t,
                   Device::cuda,
                   one});
    return slices;
}

// A layer's weights on the host (the matrices the GPU reads in t rounded to t, so the CPU sees the
// same values; not the router) and their views on g's device, the experts' inputs in t.
struct Layer {
    model::MoeWeights w;
    model::MoeWeightViews v;
};
Layer layer(const model::ModelConfig& cfg, const model::LayerSpec& spec, DType t, Gpu& g) {
    Layer l;
    model::MoeWeights& w = l.w;
    model::TensorList list = model::ffn_tensors(cfg, spec, nullptr, &w);
    for (model::TensorSpec& s : list)
        if (s.init == model::Init::normal)
            s.std = 1.0f / std::sqrt(static_cast<float>(s.shape[1]));
    Philox rng(1234, 0, 0);
    model::init_random(list, rng);
    for (model::DenseFfnWeights* mlp : {&w.shared})
        for (Buffer* b : {&mlp->gate_proj, &mlp->up_proj, &mlp->down_proj})
            round_to(*b, t);
    for (model::DenseFfnWeights& e : w.experts)
        for (Buffer* b : {&e.gate_proj, &e.up_proj, &e.down_proj})
            round_to(*b, t);
    round_to(w.fc1_latent_proj, t);
    round_to(w.fc2_latent_proj, t);
    auto up = [&](const Buffer& b, DType dt) {
        return b.view().data ? to_device(b.view(), dt, g.arena, g.s) : Tensor{};
    };
    model::MoeWeightViews& v = l.v;
    v.router = up(w.gate, DType::f32);
    v.bias = up(w.correction_bias, DType::f32);
    v.host_bias = w.correction_bias.view();
    v.fc1 = up(w.fc1_latent_proj, t);
    v.fc2 = up(w.fc2_latent_proj, t);
    v.experts.gate = stacked(w, &model::DenseFfnWeights::gate_proj, t, g);
    v.experts.up = stacked(w, &model::DenseFfnWeights::up_proj, t, g);
    v.experts.down = stacked(w, &model::DenseFfnWeights::down_proj, t, g);
    v.shared.gate_proj = up(w.shared.gate_proj, t);
    v.shared.up_proj = up(w.shared.up_proj, t);
    v.shared.down_proj = up(w.shared.down_proj, t);
    v.act = t;
    return l;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(cuda_moe_forward, *utf::label("cuda"))

BOOST_AUTO_TEST_CASE(moe_forward_on_cuda_equals_cpu, *utf::precondition(need_gpu)) {
    struct Case {
        model::Ffn ffn;
        model::ExpertAct act;
        double capacity_factor;
    };
    for (const Case& c : {Case{model::Ffn::moe, model::ExpertAct::swiglu, 1.0},
                          Case{model::Ffn::latent_moe, model::ExpertAct::relu2, 0.0}})
        for (DType t : {DType::f32, DType::bf16}) {
            const model::ModelConfig cfg = config(c.act, c.capacity_factor);
            model::LayerSpec spec;
            spec.ffn = c.ffn;
            Gpu g;
            cu::Blas blas{g.s, g.arena, 16};
            const backend::Ctx gpu{Device::cuda, &g.s, &g.arena, &blas};
            const Layer l = layer(cfg, spec, t, g);
            const model::MoeWeights& w = l.w;
            const model::MoeWeightViews& v = l.v;

            const int64_t n = 19, d = cfg.hidden_size;
            Buffer x = random({n, d}, 90, t);  // the GPU casts x to t: the CPU sees t's values
            Buffer want(DType::f32, {n, d});
            model::Routing routing;
            model::moe_forward(cfg, spec, w, x.view(), want.view(), &routing);
            Tensor dy = g.arena.tensor(DType::f32, {n, d});
            model::MoeCommStats stats;
            model::moe_forward_parallel(gpu,
                                        cfg,
                                        spec,
                                        v,
                                        to_device(x.view(), DType::f32, g.arena, g.s),
                                        dy,
                                        model::MoeParallel{},
                                        &stats);
            // f32 outputs of experts run in t: t's tolerance (bf16: h and the outputs rounded)
            const Buffer got = to_host(dy, g.s);
            const double err = rel_error(got.ptr<float>(), want.ptr<float>(), n * d);
            BOOST_TEST_INFO(static_cast<int>(c.ffn) << " " << to_string(t) << ": error " << err);
            BOOST_TEST(err < tolerance(t));
            BOOST_TEST(stats.tokens_per_expert == routing.tokens_per_expert,
                       boost::test_tools::per_element());
        }
}

BOOST_AUTO_TEST_CASE(fused_branch_equals_cpu_and_the_generic_path, *utf::precondition(need_gpu)) {
    model::ModelConfig cfg = config(model::ExpertAct::swiglu, 0.0);  // dropless
    cfg.hidden_size = 128;  // the widths the fused kernels tile
    cfg.moe.moe_intermediate = 64;
    cfg.moe.shared_intermediate = 64;
    cfg.moe.latent_size = 128;
    for (model::Ffn ffn : {model::Ffn::moe, model::Ffn::latent_moe}) {
        model::LayerSpec spec;
        spec.ffn = ffn;
        const int64_t n = 37, d = cfg.hidden_size;
        BOOST_TEST_INFO(static_cast<int>(ffn));
        BOOST_REQUIRE(model::moe_runs_fused(
            Device::cuda, cfg, spec, DType::bf16, n, model::MoeParallel{}, false));
        GpuCtx gc;
        const Layer l = layer(cfg, spec, DType::bf16, gc.g);
        Buffer x = random({n, d}, 91, DType::bf16);
        Buffer want(DType::f32, {n, d});
        model::Routing routing;
        model::moe_forward(cfg, spec, l.w, x.view(), want.view(), &routing);
        const Tensor xd = gc.up(x);
        Tensor fused = gc.f32({n, d}), generic = gc.f32({n, d});
        model::MoeCommStats with_load, without_load, off_stats;
        model::MoeParallel par;
        model::moe_forward_parallel(gc.ctx, cfg, spec, l.v, xd, fused, par, &with_load);
        par.fused_load = false;
        model::moe_forward_parallel(gc.ctx, cfg, spec, l.v, xd, fused, par, &without_load);
        par.fused = false;
        model::moe_forward_parallel(gc.ctx, cfg, spec, l.v, xd, generic, par, &off_stats);
        // f32 outputs of bf16 experts (h and the experts' outputs rounded): the bf16 tolerance
        auto close = [&](const char* what, const Buffer& ref) {
            const Buffer got = to_host(fused, gc.g.s);
            const double err = rel_error(got.ptr<float>(), ref.ptr<float>(), n * d);
            BOOST_TEST_INFO(what << ": normalised error " << err);
            BOOST_TEST(err < tolerance(DType::bf16));
        };
        close("fused against the CPU", want);
        close("fused against generic", to_host(generic, gc.g.s));
        // the fused branch dispatches nothing; the generic one sends each token once
        BOOST_TEST(with_load.dispatch_rows == 0);
        BOOST_TEST(off_stats.dispatch_rows == n);
        BOOST_TEST(with_load.calls == 1);
        BOOST_TEST(with_load.tokens_per_expert == routing.tokens_per_expert,
                   boost::test_tools::per_element());
        BOOST_TEST(without_load.calls == 1);
        BOOST_TEST(without_load.tokens_per_expert.empty());
    }
}

BOOST_AUTO_TEST_SUITE_END()
