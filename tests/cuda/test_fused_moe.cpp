// The fused MoE kernels (hymoe/backend/cuda_fused.h) against model/ffn.h: routing on the CPU's
// logits for three routers (DeepSeek: σ + bias, 4 groups keep 2, ρ 2.5; Kimi: σ + bias, weights
// from the biased scores, ε 1e-20, ρ 2.446; softmax without bias, groups filled with −inf, no
// renormalisation), expert ids equal to model::route's and weights within 1e-5; the dispatch
// plan equal to model/moe.cpp's (experts' rows in token order, first rows, GEMM row tiles);
// then the two grouped expert GEMMs and the combine against dense_ffn_forward of each token's
// experts summed with its weights (bf16 inputs and weights, bf16 h and expert outputs: the bf16
// tolerance), written fresh and added onto a shared-expert output.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "cuda_test.h"
#include "hymoe/backend/cuda_fused.h"
#include "hymoe/backend/ops.h"
#include "hymoe/model/ffn.h"
#include "hymoe/model/weights.h"

namespace utf = boost::unit_test;
using namespace hymoe;
using namespace hymoe::cuda_test;
using model::ExpertAct;
using model::Ffn;
using model::LayerSpec;
using model::Mixer;
using model::ModelConfig;
using model::MoeConfig;
using model::Scoring;

namespace {

const LayerSpec moe_layer{Mixer::kda, false, Ffn::moe};

ModelConfig router_config(
    const char* type, Scoring scoring, bool bias, int groups, int kept, int k) {
    ModelConfig c;
    c.model_type = type;
    c.hidden_size = 256;
    MoeConfig& m = c.moe;
    m.n_routed_experts = 32;
    m.top_k = k;
    m.moe_intermediate = 128;
    m.n_group = groups;
    m.topk_group = kept;
    m.scoring = scoring;
    m.correction_bias = bias;
    return c;
}

// Weights at unit-variance scale, rounded to bf16 (the experts run on bf16 weights).
model::MoeWeights random_weights(const ModelConfig& cfg, uint64_t seed) {
    model::MoeWeights w;
    model::TensorList list = model::ffn_tensors(cfg, moe_layer, nullptr, &w);
    for (model::TensorSpec& s : list)
        if (s.init == model::Init::normal)
            s.std = 1.0f / std::sqrt(static_cast<float>(s.shape[1]));
    Philox rng(seed, 0, 0);
    model::init_random(list, rng);
    for (model::DenseFfnWeights& e : w.experts)
        for (Buffer* b : {&e.gate_proj, &e.up_proj, &e.down_proj})
            round_to(*b, DType::bf16);
    return w;
}

// model::route's rule for `cfg` as kernel parameters (model/router.cpp weight_rule).
cu::MoeRouteParams route_params(const ModelConfig& cfg, int n_tok) {
    const bool kimi = cfg.model_type == "kimi_linear";
    cu::MoeRouteParams p;
    p.n_tok = n_tok;
    p.n_exp = cfg.moe.n_routed_experts;
    p.top_k = cfg.moe.top_k;
    p.n_group = cfg.moe.n_group;
    p.topk_group = cfg.moe.topk_group;
    p.softmax = cfg.moe.scoring == Scoring::softmax;
    p.renormalize = cfg.moe.renormalize && (!kimi || cfg.moe.top_k > 1);
    p.renorm_eps = kimi ? 1e-20f : 0.0f;
    p.scale = static_cast<float>(cfg.moe.routed_scaling_factor);
    p.weights_from_biased = cfg.moe.weights_from_biased_scores;
    p.group_fill = kimi ? 0.0f : -std::numeric_limits<float>::infinity();
    return p;
}

// Device tensor of an [E, rows, cols] stack of the experts' matrices.
Tensor stack(const model::MoeWeights& w, Buffer model::DenseFfnWeights::*m, Gpu& g) {
    const Shape one = (w.experts[0].*m).view().shape;
    const auto E = static_cast<int64_t>(w.experts.size());
    Buffer all(DType::f32, {E, one[0], one[1]});
    for (int64_t e = 0; e < E; ++e)
        std::copy_n((w.experts[static_cast<size_t>(e)].*m).ptr<float>(),
                    one[0] * one[1],
                    all.ptr<float>() + e * one[0] * one[1]);
    return to_device(all.view(), DType::bf16, g.arena, g.s);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(cuda_fused_moe, *utf::label("cuda"))

BOOST_AUTO_TEST_CASE(route_plan_experts_and_combine_match_the_cpu, *utf::precondition(need_gpu)) {
    Gpu g;
    const int n_tok = 1200;
    ModelConfig ds = router_config("deepseek_v32", Scoring::sigmoid, true, 4, 2, 4);
    ds.moe.routed_scaling_factor = 2.5;
    ModelConfig kimi = router_config("kimi_linear", Scoring::sigmoid, true, 1, 1, 6);
    kimi.moe.routed_scaling_factor = 2.446;
    kimi.moe.weights_from_biased_scores = true;
    ModelConfig soft = router_config("hymoe", Scoring::softmax, false, 4, 2, 4);
    soft.moe.renormalize = false;
    uint64_t seed = 500;
    for (const ModelConfig& cfg : {ds, kimi, soft}) {
        const int E = cfg.moe.n_routed_experts, k = cfg.moe.top_k, d = cfg.hidden_size;
        const int inter = cfg.moe.moe_intermediate;
        const model::MoeWeights w = random_weights(cfg, seed++);
        Buffer x = random({n_tok, d}, static_cast<uint32_t>(seed++), DType::bf16);
        const model::Routing want = model::route(cfg, w, x.view());
        Buffer logits(DType::f32, {n_tok, E});  // as router_scores: one token at a time
        for (int64_t t = 0; t < n_tok; ++t) {
            Tensor row = logits.view().rows(t, 1);
            ops::linear(x.view().rows(t, 1), w.gate.view(), row);
        }

        // routing
        Tensor dlogits = to_device(logits.view(), DType::f32, g.arena, g.s);
        Tensor dbias;
        if (cfg.moe.correction_bias)
            dbias = to_device(w.correction_bias.view(), DType::f32, g.arena, g.s);
        Tensor didx = g.arena.tensor(DType::i32, {n_tok, k});
        Tensor dweight = g.arena.tensor(DType::f32, {n_tok, k});
        cu::MoeRouteParams rp = route_params(cfg, n_tok);
        rp.logits = dlogits.ptr<float>();
        rp.bias = cfg.moe.correction_bias ? dbias.ptr<float>() : nullptr;
        rp.idx = didx.ptr<int32_t>();
        rp.weight = dweight.ptr<float>();
        cu::moe_route(g.s, rp);
        const std::vector<int32_t> idx = to_host_i32(didx, g.s);
        Buffer weight = to_host(dweight, g.s);
        const std::vector<int64_t> idx64(idx.begin(), idx.end());
        BOOST_TEST_INFO(cfg.model_type << " router: expert ids");
        BOOST_TEST(idx64 == want.idx, boost::test_tools::per_element());
        const double err_w = rel_error(weight.ptr<float>(), want.weight.data(), int64_t{n_tok} * k);
        BOOST_TEST_INFO(cfg.model_type << " router: weights, normalised error " << err_w);
        BOOST_TEST(err_w < tolerance(DType::f32));

        // dispatch plan: model/moe.cpp's plan_dispatch on the same ids
        const cu::MoePlan plan = cu::moe_plan(n_tok, k, E, d, inter);
        BOOST_TEST_REQUIRE(plan.supported);
        void* scratch = g.arena.allocate(static_cast<size_t>(plan.scratch_bytes));
        const cu::MoeDispatch disp = cu::moe_dispatch_arrays(plan, n_tok, k, E, scratch);
        cu::moe_dispatch_plan(g.s, plan, didx.ptr<int32_t>(), disp);
        std::vector<int32_t> offset(E + 1, 0), tile_start(E + 1, 0), row_of(n_tok * k);
        for (int32_t e : idx)
            ++offset[static_cast<size_t>(e) + 1];
        for (int e = 0; e < E; ++e) {
            tile_start[e + 1] =
                tile_start[e] + (offset[e + 1] + cu::kMoeTileRows - 1) / cu::kMoeTileRows;
            offset[e + 1] += offset[e];
        }
        std::vector<int32_t> cursor(offset.begin(), offset.end() - 1);
        for (size_t a = 0; a < idx.size(); ++a)
            row_of[a] = cursor[static_cast<size_t>(idx[a])]++;
        auto device_i32 = [&](const int32_t* p, size_t n) {
            std::vector<int32_t> v(n);
            cu::copy_to_host(v.data(), p, n * sizeof(int32_t), g.s);
            g.s.synchronize();
            return v;
        };
        BOOST_TEST(device_i32(disp.offset, E + 1) == offset, boost::test_tools::per_element());
        BOOST_TEST(device_i32(disp.tile_start, E + 1) == tile_start,
                   boost::test_tools::per_element());
        BOOST_TEST(device_i32(disp.row_of, row_of.size()) == row_of,
                   boost::test_tools::per_element());
        const std::vector<int32_t> token_of = device_i32(disp.token_of, row_of.size());
        bool tokens_right = true;
        for (size_t a = 0; a < row_of.size(); ++a)
            tokens_right = tokens_right &&
                           token_of[static_cast<size_t>(row_of[a])] == static_cast<int32_t>(a) / k;
        BOOST_TEST(tokens_right);

        // experts and combine: y = Σ_i w_i · FFN_{e_i}(x_t), fresh and onto a shared output
        Buffer want_y(DType::f32, {n_tok, d});
        for (int e = 0; e < E; ++e) {
            std::vector<int64_t> tokens;
            for (size_t a = 0; a < idx.size(); ++a)
                if (idx[a] == e)
                    tokens.push_back(static_cast<int64_t>(a));
            if (tokens.empty())
                continue;
            const auto n = static_cast<int64_t>(tokens.size());
            Buffer in(DType::f32, {n, d}), out(DType::f32, {n, d});
            for (int64_t i = 0; i < n; ++i)
                std::copy_n(x.ptr<float>() + tokens[static_cast<size_t>(i)] / k * d,
                            d,
                            in.ptr<float>() + i * d);
            model::dense_ffn_forward(backend::cpu_ctx(),
                                     w.experts[static_cast<size_t>(e)],
                                     ExpertAct::swiglu,
                                     in.view(),
                                     out.view());
            for (int64_t i = 0; i < n; ++i) {
                const int64_t a = tokens[static_cast<size_t>(i)];
                const float wt = weight.ptr<float>()[a];
                for (int c = 0; c < d; ++c)
                    want_y.ptr<float>()[a / k * d + c] += wt * out.ptr<float>()[i * d + c];
            }
        }
        Tensor dx = to_device(x.view(), DType::bf16, g.arena, g.s);
        Tensor dw1 = stack(w, &model::DenseFfnWeights::gate_proj, g);
        Tensor dw3 = stack(w, &model::DenseFfnWeights::up_proj, g);
        Tensor dw2 = stack(w, &model::DenseFfnWeights::down_proj, g);
        Tensor dh = g.arena.tensor(DType::bf16, {plan.n_assign, inter});
        Tensor dout = g.arena.tensor(DType::bf16, {plan.n_assign, d});
        cu::MoeExpertParams ep;
        ep.d = d;
        ep.inter = inter;
        ep.x = dx.data;
        ep.w1 = dw1.data;
        ep.w3 = dw3.data;
        ep.w2 = dw2.data;
        ep.h = dh.data;
        ep.out = dout.data;
        cu::moe_experts(g.s, plan, disp, ep);
        Tensor dy = g.arena.tensor(DType::f32, {n_tok, d});
        cu::moe_combine(g.s, disp, dout.data, dweight.ptr<float>(), d, DType::f32, dy.data, false);
        Buffer got = to_host(dy, g.s);
        const double err_y = rel_error(got.ptr<float>(), want_y.ptr<float>(), int64_t{n_tok} * d);
        BOOST_TEST_INFO(cfg.model_type << " experts + combine: normalised error " << err_y);
        BOOST_TEST(err_y < tolerance(DType::bf16));

        Buffer shared = random({n_tok, d}, static_cast<uint32_t>(seed++), DType::f32);
        Tensor dys = to_device(shared.view(), DType::f32, g.arena, g.s);
        cu::moe_combine(g.s, disp, dout.data, dweight.ptr<float>(), d, DType::f32, dys.data, true);
        ops::add_inplace(want_y.view(), shared.view());
        Buffer got_s = to_host(dys, g.s);
        const double err_s = rel_error(got_s.ptr<float>(), want_y.ptr<float>(), int64_t{n_tok} * d);
        BOOST_TEST_INFO(cfg.model_type << " combine onto the shared output: " << err_s);
        BOOST_TEST(err_s < tolerance(DType::bf16));

        for (Tensor* t : {&dlogits, &didx, &dweight, &dx, &dw1, &dw3, &dw2, &dh, &dout, &dy, &dys})
            g.arena.free(t->data);
        if (cfg.moe.correction_bias)
            g.arena.free(dbias.data);
        g.arena.free(scratch);
    }
}

BOOST_AUTO_TEST_SUITE_END()
