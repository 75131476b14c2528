// The fused-or-generic MoE choice on the CPU (model/moe_parallel.h moe_runs_fused over
// backend/ops_moe_fused.h moe_fused_supported): each condition turned off alone refuses a layer
// that qualifies (tiny-kimi widened to the kernels' sizes), the kernels' shape limits at their
// edges; a CPU context never runs the fused branch (moe_forward_parallel with fused asked gives
// the generic path's bits), and the fused op refuses a CPU context.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "hymoe/backend/ops_moe_fused.h"
#include "hymoe/core/error.h"
#include "hymoe/core/rng.h"
#include "hymoe/model/ffn.h"
#include "hymoe/model/moe_parallel.h"
#include "hymoe/model/weights.h"

using namespace hymoe;
using namespace hymoe::model;

namespace {

// tiny-kimi with d 128 and expert widths 64: every MoE layer fits the fused kernels.
ModelConfig fused_config() {
    ModelConfig c = preset_config("tiny-kimi");
    c.hidden_size = 128;
    c.moe.moe_intermediate = 64;
    c.moe.shared_intermediate = 64;
    return c;
}

ops::MoeFusedShape fused_shape() {
    ops::MoeFusedShape s;
    s.act = DType::bf16;
    s.swiglu = true;
    s.dropless = true;
    s.n_tok = 5;
    s.top_k = 2;
    s.n_exp = 8;
    s.width = 128;
    s.inter = 64;
    return s;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(moe_fused)

BOOST_AUTO_TEST_CASE(moe_runs_fused_needs_every_condition) {
    const ModelConfig c = fused_config();
    const LayerSpec moe = c.layers[1];
    BOOST_REQUIRE((moe.ffn == Ffn::moe));
    const MoeParallel one;
    auto fused = [&](const ModelConfig& cfg, const LayerSpec& spec, DType act, int64_t n) {
        return moe_runs_fused(Device::cuda, cfg, spec, act, n, one, false);
    };
    BOOST_TEST(fused(c, moe, DType::bf16, 1));
    BOOST_TEST(fused(c, moe, DType::bf16, 256));
    BOOST_TEST(!moe_runs_fused(Device::cpu, c, moe, DType::bf16, 1, one, false));
    MoeParallel off;
    off.fused = false;  // DeviceModelOptions::fused off
    BOOST_TEST(!moe_runs_fused(Device::cuda, c, moe, DType::bf16, 1, off, false));
    const comm::Comm group;  // any group: only its presence counts
    MoeParallel tp, ep;
    tp.tp = &group;
    ep.ep = &group;
    BOOST_TEST(!moe_runs_fused(Device::cuda, c, moe, DType::bf16, 1, tp, false));
    BOOST_TEST(!moe_runs_fused(Device::cuda, c, moe, DType::bf16, 1, ep, false));
    const bool adapters = true;  // routed-expert adapters in use
    BOOST_TEST(!moe_runs_fused(Device::cuda, c, moe, DType::bf16, 1, one, adapters));
    BOOST_TEST(!fused(c, moe, DType::f32, 1));  // fp32 matrices
    ModelConfig relu = c;
    relu.moe.expert_act = ExpertAct::relu2;
    BOOST_TEST(!fused(relu, moe, DType::bf16, 1));
    ModelConfig capped = c;
    capped.moe.capacity_factor = 1.25;
    BOOST_TEST(!fused(capped, moe, DType::bf16, 1));
    const ModelConfig tiny = preset_config("tiny");  // d 64: the kernels need multiples of 128
    BOOST_TEST(!fused(tiny, tiny.layers[1], DType::bf16, 1));
    ModelConfig latent = c;  // a latent layer's width is the latent's
    latent.moe.latent_size = 96;
    LayerSpec lat = moe;
    lat.ffn = Ffn::latent_moe;
    BOOST_TEST(!fused(latent, lat, DType::bf16, 1));
    latent.moe.latent_size = 256;
    BOOST_TEST(fused(latent, lat, DType::bf16, 1));
}

BOOST_AUTO_TEST_CASE(fused_shapes_at_the_kernels_limits) {
    BOOST_TEST(ops::moe_fused_supported(fused_shape()));
    auto with = [](auto change) {
        ops::MoeFusedShape s = fused_shape();
        change(s);
        return ops::moe_fused_supported(s);
    };
    BOOST_TEST(with([](ops::MoeFusedShape& s) { s.n_tok = 0; }));
    BOOST_TEST(with([](ops::MoeFusedShape& s) { s.n_exp = s.top_k = 1024; }));
    BOOST_TEST(!with([](ops::MoeFusedShape& s) { s.n_exp = 1025; }));
    BOOST_TEST(!with([](ops::MoeFusedShape& s) { s.top_k = 9; }));  // more than E
    BOOST_TEST(!with([](ops::MoeFusedShape& s) { s.act = DType::f32; }));
    BOOST_TEST(!with([](ops::MoeFusedShape& s) { s.swiglu = false; }));
    BOOST_TEST(!with([](ops::MoeFusedShape& s) { s.dropless = false; }));
    BOOST_TEST(with([](ops::MoeFusedShape& s) { s.width = 384; }));
    BOOST_TEST(!with([](ops::MoeFusedShape& s) { s.width = 192; }));
    BOOST_TEST(with([](ops::MoeFusedShape& s) { s.inter = 192; }));
    BOOST_TEST(!with([](ops::MoeFusedShape& s) { s.inter = 96; }));
    BOOST_TEST(!with([](ops::MoeFusedShape& s) { s.width = int64_t{1} << 32; }));
}

BOOST_AUTO_TEST_CASE(a_cpu_context_runs_the_generic_path) {
    const ModelConfig c = fused_config();
    const LayerSpec spec = c.layers[1];
    MoeWeights w;
    TensorList list = ffn_tensors(c, spec, nullptr, &w);
    for (TensorSpec& s : list)
        if (s.init == Init::normal)
            s.std = 1.0f / std::sqrt(static_cast<float>(s.shape[1]));
    Philox rng(77, 0, 0);
    init_random(list, rng);
    const int64_t n = 6, d = c.hidden_size;
    Buffer x(DType::f32, {n, d});
    for (int64_t i = 0; i < n * d; ++i)
        x.ptr<float>()[i] = std::sin(0.37f * static_cast<float>(i));
    Buffer want(DType::f32, {n, d}), got(DType::f32, {n, d});
    moe_forward(c, spec, w, x.view(), want.view());
    MoeParallel asked;  // fused asked (the default), groups of one: the CPU has no fused branch
    BOOST_REQUIRE(asked.fused);
    MoeCommStats stats;
    Tensor y = got.view();
    moe_forward_parallel(backend::cpu_ctx(), c, spec, moe_views(w), x.view(), y, asked, &stats);
    BOOST_TEST(std::memcmp(got.ptr<float>(), want.ptr<float>(), want.view().bytes()) == 0);
    BOOST_TEST(stats.dispatch_rows == n);  // the generic pipeline's count (the fused one has none)
}

BOOST_AUTO_TEST_CASE(the_fused_op_refuses_a_cpu_context) {
    Buffer idx(DType::i32, {1, 2}), weight(DType::f32, {1, 2}), z(DType::bf16, {1, 128});
    Buffer acc(DType::f32, {1, 128});
    Tensor out = acc.view();
    BOOST_CHECK_THROW(
        ops::moe_fused_experts(
            backend::cpu_ctx(), idx.view(), weight.view(), z.view(), {}, {}, {}, out, nullptr),
        Error);
}

BOOST_AUTO_TEST_SUITE_END()
