// The routed experts in the grouped form the GPU model runs (backend/moe_groups.h plan, then the
// Ctx ops of backend/ops_moe.h: gather, one grouped product per matrix, the activation over every
// grouped row, the slot-ordered combine) on a CPU context equal the CPU's own expert stage
// (model/moe_experts.h experts_forward, one dense_ffn_forward per expert) bit for bit, for SwiGLU
// and relu2 experts with a dropped slot: so one expert stage written with the grouped ops keeps
// every CPU result. The router's logits and selection as Ctx ops (backend/moe_route.h) under the
// config's rule (route_rule.h) equal route() bit for bit, and leave route()'s scores behind:
// sigmoid with a bias and a group limit, softmax, kimi_linear's 0.0 group fill and biased weights.
#include <cmath>
#include <cstring>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "../../../src/model/moe_experts.h"
#include "../../../src/model/route_rule.h"
#include "../../../src/model/router.h"
#include "hymoe/backend/moe_groups.h"
#include "hymoe/backend/moe_route.h"
#include "hymoe/backend/ops.h"
#include "hymoe/backend/ops_moe.h"
#include "hymoe/core/rng.h"
#include "hymoe/model/ffn.h"
#include "hymoe/model/weights.h"

using namespace hymoe;
using namespace hymoe::model;

namespace {

ModelConfig tiny(ExpertAct act) {
    ModelConfig c;
    c.model_type = "deepseek_v32";
    c.hidden_size = 48;
    c.moe.n_routed_experts = 5;
    c.moe.top_k = 3;
    c.moe.moe_intermediate = 40;
    c.moe.expert_act = act;
    return c;
}

Buffer normal(Shape shape, uint64_t seed) {
    Buffer b(DType::f32, std::move(shape));
    Philox rng(seed, 1, 0);
    rng.fill_normal(b.ptr<float>(), static_cast<size_t>(b.view().numel()), 0.0f, 0.5f);
    return b;
}

// The grouped form on a CPU context: out [n, w] = Σ slots weight · Expert(in row).
void grouped_experts(const MoeWeights& w,
                     ExpertAct act,
                     const std::vector<int32_t>& expert,
                     const std::vector<float>& weight,
                     int64_t k,
                     const Tensor& in,
                     Tensor& out) {
    const backend::Ctx ctx = backend::cpu_ctx();
    const int64_t n = in.dim(0), width = in.dim(1), E = static_cast<int64_t>(w.experts.size());
    const backend::MoeGroups g = backend::moe_group_rows(expert.data(), n, k, E);
    const std::vector<int64_t> counts = g.rows_per_expert();
    Buffer row(DType::i64, {n * k});
    std::memcpy(row.view().data, g.row.data(), g.row.size() * sizeof(int64_t));
    Buffer wt(DType::f32, {n * k});
    std::memcpy(wt.view().data, weight.data(), weight.size() * sizeof(float));
    std::vector<Tensor> up_w, gate_w, down_w;
    for (const DenseFfnWeights& e : w.experts) {
        up_w.push_back(e.up_proj.view());
        gate_w.push_back(e.gate_proj.view());
        down_w.push_back(e.down_proj.view());
    }
    const int64_t inter = w.experts[0].up_proj.view().dim(0);
    Buffer in_g(DType::f32, {g.n_rows(), width}), up(DType::f32, {g.n_rows(), inter});
    Buffer gate(DType::f32, {g.n_rows(), inter}), out_g(DType::f32, {g.n_rows(), width});
    ops::moe_gather(ctx, in, row.view(), k, in_g.view());
    ops::grouped_linear(ctx, in_g.view(), up_w, counts, up.view());
    Tensor h = up.view();
    if (act == ExpertAct::swiglu) {
        ops::grouped_linear(ctx, in_g.view(), gate_w, counts, gate.view());
        ops::swiglu(ctx, gate.view(), up.view(), gate.view());
        h = gate.view();
    } else {
        ops::relu2_inplace(ctx, up.view());
    }
    ops::grouped_linear(ctx, h, down_w, counts, out_g.view());
    ops::moe_combine(ctx, out_g.view(), row.view(), wt.view(), k, out);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(moe_grouped)

BOOST_AUTO_TEST_CASE(grouped_ops_equal_experts_forward_bitwise) {
    for (ExpertAct act : {ExpertAct::swiglu, ExpertAct::relu2}) {
        const ModelConfig cfg = tiny(act);
        const LayerSpec spec{Mixer::kda, false, Ffn::moe};
        MoeWeights w;
        TensorList list = ffn_tensors(cfg, spec, nullptr, &w);
        Philox rng(3, 0, 0);
        init_random(list, rng);
        const int64_t n = 9, k = cfg.moe.top_k, d = cfg.hidden_size;
        const Buffer x = normal({n, d}, 5);
        std::vector<int32_t> expert(static_cast<size_t>(n * k));
        std::vector<float> weight(expert.size());
        for (size_t a = 0; a < expert.size(); ++a) {
            expert[a] = static_cast<int32_t>((a * 7 + a / 3) % 5);
            weight[a] = 0.25f + 0.125f * static_cast<float>(a % 4);
        }
        expert[4] = -1;  // a dropped slot
        weight[4] = 0.0f;
        expert[9] = expert[10] = expert[11] = -1;  // a token with none computed
        Buffer want(DType::f32, {n, d}), got(DType::f32, {n, d});
        std::vector<int64_t> load(5, 0);
        const detail::RowSlots slots{expert.data(), weight.data(), n, k};
        detail::experts_forward(
            w, act, slots, x.view(), want.view(), [] {}, load);
        grouped_experts(w, act, expert, weight, k, x.view(), got.view());
        BOOST_TEST_INFO(static_cast<int>(act));
        BOOST_TEST(std::memcmp(want.view().data, got.view().data, want.view().bytes()) == 0);
        BOOST_TEST(load[0] + load[1] + load[2] + load[3] + load[4] == n * k - 4);
    }
}

BOOST_AUTO_TEST_CASE(route_op_equals_route_scores_bitwise) {
    for (int variant = 0; variant < 3; ++variant) {
        ModelConfig cfg = tiny(ExpertAct::swiglu);
        MoeConfig& m = cfg.moe;
        m.n_routed_experts = 8;
        m.top_k = 2;
        m.routed_scaling_factor = 2.5;
        if (variant == 0) {  // DS32: sigmoid, bias, 4 groups keep 2
            m.correction_bias = true;
            m.n_group = 4;
            m.topk_group = 2;
        } else if (variant == 1) {  // softmax, no bias
            m.scoring = Scoring::softmax;
        } else {  // kimi_linear: 0.0 fill, biased weights, 1e-20 renormalisation
            cfg.model_type = "kimi_linear";
            m.correction_bias = true;
            m.n_group = 2;
            m.topk_group = 1;
            m.weights_from_biased_scores = true;
        }
        const LayerSpec spec{Mixer::kda, false, Ffn::moe};
        MoeWeights w;
        TensorList list = ffn_tensors(cfg, spec, nullptr, &w);
        Philox rng(4, 0, 0);
        init_random(list, rng);
        const int64_t n = 11, k = m.top_k, E = m.n_routed_experts;
        const Buffer x = normal({n, cfg.hidden_size}, 6);
        const Routing want = route(cfg, w, x.view());

        Buffer logits(DType::f32, {n, E});
        ops::router_logits(backend::cpu_ctx(), x.view(), w.gate.view(), logits.view());
        Buffer idx(DType::i32, {n, k}), weight(DType::f32, {n, k});
        const Tensor bias = m.correction_bias ? w.correction_bias.view() : Tensor{};
        ops::moe_route(backend::cpu_ctx(),
                       detail::route_rule(cfg),
                       logits.view(),
                       bias,
                       idx.view(),
                       weight.view());
        BOOST_TEST_INFO("variant " << variant);
        for (int64_t a = 0; a < n * k; ++a) {
            BOOST_TEST(idx.ptr<int32_t>()[a] == want.idx[static_cast<size_t>(a)]);
            BOOST_TEST(weight.ptr<float>()[a] == want.weight[static_cast<size_t>(a)]);
        }
        const Buffer scores = detail::router_scores(cfg, w, x.view());  // the scores left behind
        BOOST_TEST(std::memcmp(scores.view().data, logits.view().data, scores.view().bytes()) == 0);
    }
}

BOOST_AUTO_TEST_SUITE_END()
