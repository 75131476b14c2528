// The MoE ops (backend/ops_moe.h) and the MLP on views (model/ffn_views.h) on a CUDA context
// against the same calls on the CPU context, in fp32 and bf16: the gather of a hand-worked routing
// (rows without a computed slot, a slot of each expert) into its expert groups, the grouped
// product over slices of one stacked [E, out, in] tensor, the weighted combine in slot order into
// fp32; a grouped product over matrices that are not one stacked tensor is refused. The MLP
// (swiglu and relu2, as the GPU model's dense layers and shared experts run it) with an adapter's
// factor views on two of its rows. The router's logits (GEMV per token on the CPU, one GEMM on
// CUDA) within 1e-5, and its selection on the same logits: equal experts, weights within 1e-5,
// for sigmoid with a bias and a group limit, softmax, and kimi_linear's 0.0 fill with biased
// weights. The GPU model's routed expert stage (moe_grouped.h experts_grouped over slices of the
// stacked experts, adapters as factor views on one expert's rows of adapter 1) against the same
// call on the CPU context with the same adapters as host slots (which equals one dense_ffn_forward
// per expert bit for bit: tests/unit/model/test_moe_grouped.cpp), SwiGLU and ReLU², fp32 and bf16.
#include <cstdint>
#include <cstring>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "../../src/model/moe_grouped.h"
#include "cuda_test.h"
#include "hymoe/backend/cuda_gemm.h"
#include "hymoe/backend/moe_groups.h"
#include "hymoe/backend/moe_route.h"
#include "hymoe/backend/ops.h"
#include "hymoe/backend/ops_moe.h"
#include "hymoe/core/error.h"
#include "hymoe/core/rng.h"
#include "hymoe/model/ffn_views.h"
#include "hymoe/model/weights.h"

namespace utf = boost::unit_test;
using namespace hymoe;
using namespace hymoe::cuda_test;

namespace {

// A CUDA context over a test's stream and arena.
// Slice e of a stacked [E, rows, cols] device tensor.
Tensor slice(const Tensor& stacked, int64_t e) {
    const int64_t rows = stacked.dim(1), cols = stacked.dim(2);
    return Tensor{static_cast<char*>(stacked.data) +
                      e * rows * cols * static_cast<int64_t>(dtype_size(stacked.dtype)),
                  stacked.dtype,
                  Device::cuda,
                  {rows, cols}};
}

}  // namespace

BOOST_AUTO_TEST_SUITE(cuda_moe_ops, *utf::label("cuda"))

BOOST_AUTO_TEST_CASE(gather_grouped_product_combine, *utf::precondition(need_gpu)) {
    GpuCtx gc(16);
    const backend::Ctx cpu = backend::cpu_ctx();
    // 6 rows, k = 2, E = 4: row 2 has no computed slot, expert 3 gets none
    const std::vector<int32_t> expert = {2, 0, 0, 1, -1, -1, 1, 2, 0, -1, 2, 1};
    const int64_t n = 6, k = 2, E = 4, w = 64, out_w = 96;
    const backend::MoeGroups groups = backend::moe_group_rows(expert.data(), n, k, E);
    const std::vector<int64_t> counts = groups.rows_per_expert();
    Buffer row(DType::i64, {n * k});
    std::memcpy(row.view().data, groups.row.data(), groups.row.size() * sizeof(int64_t));
    const Tensor d_row = to_device_i64(groups.row, gc.g.arena, gc.g.s);
    const Buffer weight = random({n * k}, 50, DType::f32);
    const Tensor d_weight = gc.up(weight, DType::f32);
    for (DType t : {DType::f32, DType::bf16}) {
        const Buffer x = random({n, w}, 51, t);
        const Buffer mats = random({E, out_w, w}, 52, t);  // the stacked experts' matrix
        const Tensor d_mats = gc.up(mats, t);
        std::vector<Tensor> host_w, dev_w;
        for (int64_t e = 0; e < E; ++e) {
            host_w.push_back(
                Tensor{mats.ptr<float>() + e * out_w * w, DType::f32, Device::cpu, {out_w, w}});
            dev_w.push_back(slice(d_mats, e));
        }

        Buffer in(DType::f32, {groups.n_rows(), w});
        Tensor d_in = gc.g.arena.tensor(t, {groups.n_rows(), w});
        ops::moe_gather(cpu, x.view(), row.view(), k, in.view());
        ops::moe_gather(gc.ctx, gc.up(x, t), d_row, k, d_in);
        expect_close("moe_gather", d_in, in, gc.g.s);

        Buffer prod(DType::f32, {groups.n_rows(), out_w});
        Tensor d_prod = gc.g.arena.tensor(t, {groups.n_rows(), out_w});
        ops::grouped_linear(cpu, in.view(), host_w, counts, prod.view());
        ops::grouped_linear(gc.ctx, d_in, dev_w, counts, d_prod);
        expect_close("grouped_linear", d_prod, prod, gc.g.s);

        round_to(prod, t);  // the combine's input as the device holds it
        Buffer y(DType::f32, {n, out_w});
        Tensor d_y = gc.g.arena.tensor(DType::f32, {n, out_w});
        ops::moe_combine(cpu, prod.view(), row.view(), weight.view(), k, y.view());
        ops::moe_combine(gc.ctx, gc.up(prod, t), d_row, d_weight, k, d_y);
        expect_close("moe_combine", d_y, y, gc.g.s);
        const Buffer got = to_host(d_y, gc.g.s);
        BOOST_TEST(got.ptr<float>()[2 * out_w] == 0.0f);  // row 2: no computed slot

        std::vector<Tensor> apart = dev_w;
        apart[1] = apart[3];  // not slice 1 of the stack
        BOOST_CHECK_THROW(ops::grouped_linear(gc.ctx, d_in, apart, counts, d_prod), Error);
    }
}

BOOST_AUTO_TEST_CASE(mlp_on_views_with_factor_adapters, *utf::precondition(need_gpu)) {
    GpuCtx gc(16);
    const backend::Ctx cpu = backend::cpu_ctx();
    const int64_t n = 7, width = 64, inter = 128, r = 4;
    const Buffer A = random({r, width}, 60, DType::f32), B = random({inter, r}, 61, DType::f32);
    const std::vector<int64_t> rows = {1, 4};
    Buffer host_rows(DType::i64, {2});
    std::memcpy(host_rows.view().data, rows.data(), sizeof(int64_t) * 2);
    for (model::ExpertAct act : {model::ExpertAct::swiglu, model::ExpertAct::relu2})
        for (DType t : {DType::f32, DType::bf16}) {
            const Buffer x = random({n, width}, 62, t), gate = random({inter, width}, 63, t);
            const Buffer up = random({inter, width}, 64, t), down = random({width, inter}, 65, t);
            model::DenseFfnViews hw, dw;
            if (act == model::ExpertAct::swiglu) {
                hw.gate_proj = gate.view();
                dw.gate_proj = gc.up(gate, t);
            }
            hw.up_proj = up.view();
            dw.up_proj = gc.up(up, t);
            hw.down_proj = down.view();
            dw.down_proj = gc.up(down, t);
            hw.lora_views.up = {model::LoraFactorsView{A.view(), B.view(), 0.5f}};
            dw.lora_views.up = {
                model::LoraFactorsView{gc.up(A, DType::f32), gc.up(B, DType::f32), 0.5f}};
            const std::vector<model::LoraRowsView> h_lora = {{0, host_rows.view()}};
            const std::vector<model::LoraRowsView> d_lora = {
                {0, to_device_i64(rows, gc.g.arena, gc.g.s)}};

            Buffer y(DType::f32, {n, width});
            Tensor d_y = gc.g.arena.tensor(DType::f32, {n, width});
            model::dense_ffn_forward(cpu, hw, act, x.view(), y.view(), nullptr, &h_lora);
            model::dense_ffn_forward(gc.ctx, dw, act, gc.up(x, t), d_y, nullptr, &d_lora);
            BOOST_TEST_INFO(static_cast<int>(act));
            expect_close("dense_ffn_forward", d_y, y, gc.g.s);
        }
}

BOOST_AUTO_TEST_CASE(router_logits_and_selection, *utf::precondition(need_gpu)) {
    GpuCtx gc(16);
    const backend::Ctx cpu = backend::cpu_ctx();
    const int64_t n = 37, d = 64, E = 16, k = 4;
    const Buffer x = random({n, d}, 70, DType::f32), gate = random({E, d}, 71, DType::f32);
    const Buffer bias = random({E}, 72, DType::f32, 0.1f);
    Buffer logits(DType::f32, {n, E});
    Tensor d_logits = gc.g.arena.tensor(DType::f32, {n, E});
    ops::router_logits(cpu, x.view(), gate.view(), logits.view());
    ops::router_logits(gc.ctx, gc.up(x, DType::f32), gc.up(gate, DType::f32), d_logits);
    expect_close("router_logits", d_logits, logits, gc.g.s);

    for (int variant = 0; variant < 3; ++variant) {
        ops::MoeRouteRule rule;
        rule.n_exp = E;
        rule.top_k = k;
        rule.scale = 2.5f;
        bool with_bias = true;
        if (variant == 0) {  // DS32: sigmoid, bias, 4 groups keep 2
            rule.n_group = 4;
            rule.topk_group = 2;
        } else if (variant == 1) {  // softmax, no bias
            rule.softmax = true;
            with_bias = false;
        } else {  // kimi_linear
            rule.n_group = 2;
            rule.topk_group = 1;
            rule.group_fill = 0.0f;
            rule.renorm_eps = 1e-20f;
            rule.weights_from_biased = true;
        }
        Buffer scores(DType::f32, {n, E});  // the same logits on both sides
        std::memcpy(scores.view().data, logits.view().data, logits.view().bytes());
        Tensor d_scores = gc.up(logits, DType::f32);
        Buffer idx(DType::i32, {n, k}), weight(DType::f32, {n, k});
        Tensor d_idx = gc.g.arena.tensor(DType::i32, {n, k});
        Tensor d_weight = gc.g.arena.tensor(DType::f32, {n, k});
        const Tensor h_bias = with_bias ? bias.view() : Tensor{};
        const Tensor d_bias = with_bias ? gc.up(bias, DType::f32) : Tensor{};
        ops::moe_route(cpu, rule, scores.view(), h_bias, idx.view(), weight.view());
        ops::moe_route(gc.ctx, rule, d_scores, d_bias, d_idx, d_weight);
        const std::vector<int32_t> got = to_host_i32(d_idx, gc.g.s);
        BOOST_TEST_INFO("variant " << variant);
        BOOST_TEST(std::memcmp(got.data(), idx.view().data, idx.view().bytes()) == 0);
        expect_close("moe_route weights", d_weight, weight, gc.g.s);
    }
}

BOOST_AUTO_TEST_CASE(routed_experts_grouped_vs_cpu, *utf::precondition(need_gpu)) {
    GpuCtx gc(16);
    const int64_t n = 13, k = 2, E = 4, d = 64, inter = 128;
    for (model::ExpertAct act : {model::ExpertAct::swiglu, model::ExpertAct::relu2})
        for (DType t : {DType::f32, DType::bf16}) {
            model::ModelConfig cfg;
            cfg.hidden_size = d;
            cfg.moe.n_routed_experts = E;
            cfg.moe.top_k = k;
            cfg.moe.moe_intermediate = inter;
            cfg.moe.expert_act = act;
            model::MoeWeights w;
            model::TensorList list =
                model::ffn_tensors(cfg, {model::Mixer::kda, false, model::Ffn::moe}, nullptr, &w);
            Philox rng(8, 0, 0);
            model::init_random(list, rng);
            for (model::DenseFfnWeights& e : w.experts)  // the values the device holds
                for (Buffer* b : {&e.gate_proj, &e.up_proj, &e.down_proj})
                    round_to(*b, t);
            // stacked device copies [E, ·, ·] and their slices
            model::detail::ExpertViews dev;
            auto stack = [&](Buffer model::DenseFfnWeights::*m, std::vector<Tensor>& slices) {
                if ((w.experts[0].*m).view().data == nullptr)
                    return;
                const Shape one = (w.experts[0].*m).view().shape;
                Buffer all(DType::f32, {E, one[0], one[1]});
                for (int64_t e = 0; e < E; ++e)
                    std::memcpy(all.ptr<float>() + e * one[0] * one[1],
                                (w.experts[e].*m).view().data,
                                (w.experts[e].*m).view().bytes());
                const Tensor d_all = gc.up(all, t);
                for (int64_t e = 0; e < E; ++e)
                    slices.push_back(slice(d_all, e));
            };
            stack(&model::DenseFfnWeights::gate_proj, dev.gate);
            stack(&model::DenseFfnWeights::up_proj, dev.up);
            stack(&model::DenseFfnWeights::down_proj, dev.down);
            // adapter 1 on expert 2's up: a host slot for the CPU, factor views for the GPU
            model::LoraSlot up2;
            up2.adapters.push_back(model::LoraPair{});
            up2.adapters.push_back(model::make_lora_pair(inter, d, 4, 0.5f, 30, 1, false));
            Philox b_rng(31, 0, 0);
            b_rng.fill_normal(up2.adapters[1].B.ptr<float>(),
                              static_cast<size_t>(up2.adapters[1].B.view().numel()),
                              0.0f,
                              0.5f);
            w.experts[2].lora.up = &up2;
            dev.lora_views.resize(E);
            dev.lora_views[2].up = {model::LoraFactorsView{},
                                    model::LoraFactorsView{gc.up(up2.adapters[1].A, DType::f32),
                                                           gc.up(up2.adapters[1].B, DType::f32),
                                                           0.5f}};

            std::vector<int32_t> expert(static_cast<size_t>(n * k));
            std::vector<float> weight(expert.size());
            std::vector<int> adapter(static_cast<size_t>(n));
            for (size_t a = 0; a < expert.size(); ++a) {
                expert[a] = static_cast<int32_t>((a * 3 + a / 5) % E);
                weight[a] = 0.5f + 0.25f * static_cast<float>(a % 3);
            }
            expert[5] = -1;  // a dropped slot
            weight[5] = 0.0f;
            for (int64_t r = 0; r < n; ++r)
                adapter[static_cast<size_t>(r)] = static_cast<int>(r % 2);
            const model::detail::RowSlots slots{expert.data(), weight.data(), n, k, adapter.data()};
            const Buffer x = random({n, d}, 80, t);
            Buffer want(DType::f32, {n, d});
            std::vector<int64_t> load(E, 0), dev_load(E, 0);
            Tensor want_y = want.view();
            model::detail::experts_grouped(
                backend::cpu_ctx(),
                model::detail::expert_views(w),
                act,
                slots,
                x.view(),
                want_y,
                [] {},
                load);
            Tensor d_y = gc.g.arena.tensor(DType::f32, {n, d});
            model::detail::experts_grouped(
                gc.ctx, dev, act, slots, gc.up(x, t), d_y, [] {}, dev_load);
            BOOST_TEST_INFO(static_cast<int>(act));
            expect_close("experts_grouped", d_y, want, gc.g.s);
            BOOST_TEST(dev_load == load, boost::test_tools::per_element());
        }
}

BOOST_AUTO_TEST_SUITE_END()
