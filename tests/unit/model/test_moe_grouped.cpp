// The routed experts in the grouped form the GPU model runs (moe_grouped.h experts_grouped: the
// backend/moe_groups.h plan, then the Ctx ops of backend/ops_moe.h: gather, one grouped product
// per matrix, the activation over every grouped row, the slot-ordered combine) on a CPU context
// equal the per-expert reference below (each expert once on its rows by dense_ffn_forward, the
// CPU's expert stage before the grouped ops) bit for bit, with the same expert load, for SwiGLU and
// relu2 experts with a dropped slot and a row without any, and with host adapters chosen per row
// (two ids, dropout) on two experts: so one expert stage written with the grouped ops keeps every
// CPU result. The router's logits and selection as Ctx ops (backend/moe_route.h) under the config's
// rule (route_rule.h) equal route() bit for bit, and leave route()'s scores behind: sigmoid with a
// bias and a group limit, softmax, kimi_linear's 0.0 group fill and biased weights.
#include <cmath>
#include <cstring>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "../../../src/model/moe_grouped.h"
#include "../../../src/model/route_rule.h"
#include "../../../src/model/router.h"
#include "hymoe/backend/moe_groups.h"
#include "hymoe/backend/moe_route.h"
#include "hymoe/backend/ops.h"
#include "hymoe/backend/ops_moe.h"
#include "hymoe/core/rng.h"
#include "hymoe/model/ffn.h"
#include "hymoe/model/lora.h"
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

// The reference expert stage: out [n, w] = Σ over each row's slots (slot order, ops::moe_combine)
// of weight · Expert(in row), each expert run once by dense_ffn_forward on its rows (ascending,
// so dropout masks number them as the grouped call does) with those rows' adapters;
// tokens_per_expert [E] += the rows each expert ran on.
void per_expert(const MoeWeights& w,
                ExpertAct act,
                const detail::RowSlots& s,
                const Tensor& in,  // [n, w]
                Tensor& out,       // [n, w]
                std::vector<int64_t>& tokens_per_expert) {
    const backend::MoeGroups g =
        backend::moe_group_rows(s.expert, s.n, s.k, static_cast<int64_t>(w.experts.size()));
    const int64_t width = in.dim(1);
    Buffer grouped(DType::f32, {g.n_rows(), width});  // [n_rows, w] rows grouped by expert
    for (size_t e = 0; e < w.experts.size(); ++e) {
        const int64_t begin = g.offset[e], rows = g.offset[e + 1] - begin;
        if (rows == 0)
            continue;
        tokens_per_expert[e] += rows;
        Buffer in_e(DType::f32, {rows, width});  // [rows, w] the expert's input rows
        std::vector<int> adapter(static_cast<size_t>(rows));
        for (int64_t a = 0; a < s.n * s.k; ++a) {
            const int64_t r = g.row[static_cast<size_t>(a)] - begin;
            if (r < 0 || r >= rows)
                continue;
            std::memcpy(in_e.ptr<float>() + r * width,
                        in.ptr<float>() + a / s.k * width,
                        static_cast<size_t>(width) * sizeof(float));
            adapter[static_cast<size_t>(r)] = s.adapter ? s.adapter[a / s.k] : 0;
        }
        const SeqBatch batch = single_rows(adapter);
        Tensor out_e = grouped.view().rows(begin, rows);
        dense_ffn_forward(backend::cpu_ctx(),
                          w.experts[e],
                          act,
                          in_e.view(),
                          out_e,
                          s.adapter ? &batch : nullptr);
    }
    const Tensor map{const_cast<int64_t*>(g.row.data()),
                     DType::i64,
                     Device::cpu,
                     {static_cast<int64_t>(g.row.size())}};
    ops::moe_combine(grouped.view(), map, s.weight, s.k, out);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(moe_grouped)

BOOST_AUTO_TEST_CASE(grouped_ops_equal_per_expert_forward_bitwise) {
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
        per_expert(w, act, slots, x.view(), want.view(), load);
        std::vector<int64_t> grouped_load(5, 0);
        detail::experts_grouped(
            backend::cpu_ctx(),
            detail::expert_views(w),
            act,
            slots,
            x.view(),
            got.view(),
            [] {},
            grouped_load);
        BOOST_TEST(grouped_load == load, boost::test_tools::per_element());
        BOOST_TEST(load[0] + load[1] + load[2] + load[3] + load[4] == n * k - 4);

        // host adapters per row (ids 0 and 1, dropout drawn per row of each expert's call) on
        // expert 1's up and expert 3's down
        auto adapter = [&](int64_t out_w, int64_t in_w, uint64_t seed) {
            LoraPair p = make_lora_pair(out_w, in_w, 4, 0.5f, seed, 1, false);
            Philox b_rng(seed, 2, 0);
            b_rng.fill_normal(
                p.B.ptr<float>(), static_cast<size_t>(p.B.view().numel()), 0.0f, 0.5f);
            return p;
        };
        const int64_t inter = cfg.moe.moe_intermediate;
        LoraSlot up1, down3;
        up1.adapters.push_back(adapter(inter, d, 21));
        up1.adapters.push_back(adapter(inter, d, 22));
        down3.adapters.push_back(LoraPair{});  // adapter 0 leaves it alone
        down3.adapters.push_back(adapter(d, inter, 23));
        up1.dropout = down3.dropout = 0.25f;
        up1.dropout_seed = down3.dropout_seed = 9;
        w.experts[1].lora.up = &up1;
        w.experts[3].lora.down = &down3;
        std::vector<int> row_adapter(static_cast<size_t>(n));
        for (int64_t t = 0; t < n; ++t)
            row_adapter[static_cast<size_t>(t)] = static_cast<int>(t % 3 == 1);
        const detail::RowSlots adapted{expert.data(), weight.data(), n, k, row_adapter.data()};
        per_expert(w, act, adapted, x.view(), want.view(), load);
        detail::experts_grouped(
            backend::cpu_ctx(),
            detail::expert_views(w),
            act,
            adapted,
            x.view(),
            got.view(),
            [] {},
            grouped_load);
        BOOST_TEST(std::memcmp(want.view().data, got.view().data, want.view().bytes()) == 0);
        Buffer plain(DType::f32, {n, d});  // the adapters change the result
        per_expert(w, act, slots, x.view(), plain.view(), load);
        w.experts[1].lora.up = w.experts[3].lora.down = nullptr;
        per_expert(w, act, slots, x.view(), plain.view(), load);
        BOOST_TEST(std::memcmp(plain.view().data, got.view().data, got.view().bytes()) != 0);
        BOOST_TEST_INFO(static_cast<int>(act));
        BOOST_TEST(std::memcmp(want.view().data, got.view().data, want.view().bytes()) == 0);
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
