// The routed experts in the grouped form on a Ctx (moe_grouped.h).
#include "moe_grouped.h"

#include <algorithm>

#include "hymoe/backend/moe_groups.h"
#include "hymoe/backend/ops.h"
#include "hymoe/backend/ops_attention.h"
#include "hymoe/backend/ops_moe.h"
#include "hymoe/core/error.h"
#include "hymoe/model/lora.h"
#include "hymoe/model/lora_rows.h"

namespace hymoe::model::detail {

ExpertViews expert_views(const MoeWeights& w) {
    ExpertViews v;
    for (const DenseFfnWeights& e : w.experts) {
        v.gate.push_back(e.gate_proj.view());
        v.up.push_back(e.up_proj.view());
        v.down.push_back(e.down_proj.view());
        v.lora.push_back(&e.lora);
    }
    return v;
}

}  // namespace hymoe::model::detail

namespace hymoe::model {

MoeWeightViews moe_views(const MoeWeights& w) {
    MoeWeightViews v;
    v.router = w.gate.view();
    v.bias = w.correction_bias.view();
    v.host_bias = w.correction_bias.view();
    v.fc1 = w.fc1_latent_proj.view();
    v.fc2 = w.fc2_latent_proj.view();
    v.experts = detail::expert_views(w);
    v.shared = ffn_views(w.shared);
    v.expert_rank = w.expert_rank;
    return v;
}

}  // namespace hymoe::model

namespace hymoe::model::detail {

GroupedCall grouped_call(const backend::Ctx& ctx,
                         backend::Scratch& scratch,
                         const MoeExpertViews& w,
                         const RowSlots& slots,
                         std::vector<int64_t>& tokens_per_expert) {
    const auto n_exp = static_cast<int64_t>(w.up.size());
    const int64_t n = slots.n, k = slots.k;
    GroupedCall out;
    out.g = backend::moe_group_rows(slots.expert, n, k, n_exp);
    const backend::MoeGroups& g = out.g;
    out.counts = g.rows_per_expert();
    for (int64_t e = 0; e < n_exp; ++e) {
        HYMOE_CHECK(out.counts[e] == 0 || w.up[e].data != nullptr,
                    "expert ",
                    e,
                    " reached a rank that does not host it");
        tokens_per_expert[static_cast<size_t>(e)] += out.counts[e];
    }
    out.row = copied(ctx, scratch, g.row, DType::i64);
    out.weight =
        copied(ctx, scratch, std::vector<float>(slots.weight, slots.weight + n * k), DType::f32);
    out.adapter.assign(static_cast<size_t>(g.n_rows()), 0);
    out.lora_rows.resize(static_cast<size_t>(n_exp));
    std::vector<int> token_adapter(static_cast<size_t>(n), 0);  // [n]
    int n_adapters = 1;
    if (slots.adapter)
        for (int64_t t = 0; t < n; ++t) {
            token_adapter[static_cast<size_t>(t)] = slots.adapter[t];
            n_adapters = std::max(n_adapters, slots.adapter[t] + 1);
        }
    for (int64_t a = 0; a < n * k; ++a)
        if (g.row[static_cast<size_t>(a)] >= 0)
            out.adapter[static_cast<size_t>(g.row[static_cast<size_t>(a)])] =
                token_adapter[static_cast<size_t>(a / k)];
    if (w.lora_views.empty())
        return out;
    LoraRows r = expert_adapter_rows(g.row, k, token_adapter, g.offset, n_adapters);
    if (r.rows.empty())
        return out;
    for (const LoraSegment& seg : r.segments)  // each expert's rows from its group's start
        for (int64_t i = seg.begin; i < seg.begin + seg.count; ++i)
            r.rows[static_cast<size_t>(i)] -= g.offset[static_cast<size_t>(seg.group)];
    const Tensor all = copied(ctx, scratch, r.rows, DType::i64);
    for (const LoraSegment& seg : r.segments)
        out.lora_rows[static_cast<size_t>(seg.group)].push_back(
            {seg.adapter,
             Tensor{
                 static_cast<char*>(all.data) + seg.begin * static_cast<int64_t>(sizeof(int64_t)),
                 DType::i64,
                 all.device,
                 {seg.count}}});
    return out;
}

void experts_grouped(const backend::Ctx& ctx,
                     const ExpertViews& w,
                     ExpertAct act,
                     const RowSlots& slots,
                     const Tensor& in,
                     Tensor& out,
                     const std::function<void()>& poll,
                     std::vector<int64_t>& tokens_per_expert) {
    const auto n_exp = static_cast<int64_t>(w.up.size());
    const int64_t k = slots.k, width = in.dim(1);
    backend::Scratch scratch(ctx);
    const GroupedCall call = grouped_call(ctx, scratch, w, slots, tokens_per_expert);
    const backend::MoeGroups& g = call.g;
    const std::vector<int64_t>& counts = call.counts;
    const Tensor &row = call.row, &weight = call.weight;
    const std::vector<int>& adapter_g = call.adapter;
    const std::vector<std::vector<LoraRowsView>>& lora_rows = call.lora_rows;
    // y += expert e's adapters on projection `which` of its rows of x, for each expert with rows
    auto adapters = [&](LoraSlot* LoraSlots::*host,
                        LoraSlotView MlpLoraViews::*which,
                        const Tensor& x,
                        Tensor& y) {
        for (int64_t e = 0; e < n_exp; ++e) {
            const int64_t begin = g.offset[static_cast<size_t>(e)], rows = counts[e];
            const LoraSlot* slot =
                w.lora.empty() || w.lora[e] == nullptr ? nullptr : w.lora[e]->*host;
            const bool views = !lora_rows[static_cast<size_t>(e)].empty();
            if (rows == 0 || (slot == nullptr && !views))
                continue;
            const SeqBatch batch = single_rows(
                std::vector<int>(adapter_g.begin() + begin, adapter_g.begin() + begin + rows));
            Tensor y_rows = y.rows(begin, rows);
            lora_forward(ctx,
                         slot,
                         views ? w.lora_views[static_cast<size_t>(e)].*which : LoraSlotView{},
                         slots.adapter ? batch : single_sequence(rows),
                         &lora_rows[static_cast<size_t>(e)],
                         x.rows(begin, rows),
                         y_rows);
        }
    };

    const int64_t n_rows = g.n_rows();
    const auto held =
        std::find_if(w.up.begin(), w.up.end(), [](const Tensor& t) { return t.data != nullptr; });
    HYMOE_CHECK(held != w.up.end(), "experts_grouped: no expert held");
    const int64_t inter = held->dim(0);
    const DType dt = in.dtype;
    // The grouped rows' temporaries, each written in full before it is read: not zero-filled on
    // the CPU (as dense_ffn_forward's, model/ffn_views.cpp).
    std::vector<Buffer> host;
    host.reserve(4);
    auto temp = [&](int64_t cols) {
        if (ctx.device != Device::cpu)
            return scratch(dt, {n_rows, cols});
        host.emplace_back(dt, Shape{n_rows, cols}, uninit);
        return host.back().view();
    };
    Tensor in_g = temp(width);  // [n_rows, w] rows grouped by expert
    ops::moe_gather(ctx, in, row, k, in_g);
    Tensor up = temp(inter);  // [n_rows, I]
    ops::grouped_linear(ctx, in_g, w.up, counts, up);
    adapters(&LoraSlots::up, &MlpLoraViews::up, in_g, up);
    poll();
    Tensor h = up;  // [n_rows, I] the activation
    if (act == ExpertAct::swiglu) {
        h = temp(inter);
        ops::grouped_linear(ctx, in_g, w.gate, counts, h);
        adapters(&LoraSlots::gate, &MlpLoraViews::gate, in_g, h);
        poll();
        ops::swiglu(ctx, h, up, h);
    } else {
        ops::relu2_inplace(ctx, up);
    }
    Tensor out_g = temp(width);  // [n_rows, w]
    ops::grouped_linear(ctx, h, w.down, counts, out_g);
    adapters(&LoraSlots::down, &MlpLoraViews::down, h, out_g);
    poll();
    ops::moe_combine(ctx, out_g, row, weight, k, out);
}

}  // namespace hymoe::model::detail
