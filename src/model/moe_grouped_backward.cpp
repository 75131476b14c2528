// The routed experts' backward in the grouped form on a Ctx (moe_grouped_backward.h).
#include "moe_grouped_backward.h"

#include <algorithm>

#include "hymoe/backend/moe_groups.h"
#include "hymoe/backend/ops.h"
#include "hymoe/backend/ops_attention.h"
#include "hymoe/backend/ops_backward.h"
#include "hymoe/backend/ops_moe.h"
#include "hymoe/backend/ops_moe_backward.h"
#include "hymoe/core/error.h"
#include "hymoe/model/lora.h"
#include "hymoe/model/lora_views.h"

namespace hymoe::model::detail {

void experts_grouped_backward(const backend::Ctx& ctx,
                              const ExpertViews& w,
                              ExpertAct act,
                              const RowSlots& slots,
                              const Tensor& in,
                              const Tensor& g,
                              Tensor& d_in,
                              Tensor& dw,
                              const std::function<void()>& poll,
                              std::vector<int64_t>& tokens_per_expert) {
    const auto n_exp = static_cast<int64_t>(w.up.size());
    const int64_t n = slots.n, k = slots.k, width = in.dim(1);
    HYMOE_CHECK(in.dtype == DType::f32 && g.shape == in.shape && d_in.shape == in.shape &&
                    dw.dtype == DType::f32 && dw.numel() == n * k && in.dim(0) == n,
                "experts_grouped_backward: in ",
                shape_string(in.shape),
                " g ",
                shape_string(g.shape),
                " d_in ",
                shape_string(d_in.shape),
                " dw ",
                shape_string(dw.shape),
                " (f32) for ",
                n,
                " rows of ",
                k,
                " slots");
    backend::Scratch scratch(ctx);
    const GroupedCall call = grouped_call(ctx, scratch, w, slots, tokens_per_expert);
    const backend::MoeGroups& gr = call.g;
    const std::vector<int64_t>& counts = call.counts;
    const Tensor &row = call.row, &weight = call.weight;
    const int64_t n_rows = gr.n_rows();
    const std::vector<int>& adapter_g = call.adapter;
    const std::vector<std::vector<LoraRowsView>>& lora_rows = call.lora_rows;
    // f(e, begin, rows) for each expert with rows
    auto each_expert = [&](auto&& f) {
        for (int64_t e = 0; e < n_exp; ++e)
            if (counts[e] > 0)
                f(e, gr.offset[static_cast<size_t>(e)], counts[e]);
    };
    // Expert e's adapters on projection `which`: its host slot and its factor views, its batch.
    struct Adapter {
        LoraSlot* host;
        const LoraSlotView* views;
        SeqBatch batch;
        const std::vector<LoraRowsView>* rows;
    };
    const LoraSlotView no_views;
    auto adapter_of =
        [&](LoraSlot* LoraSlots::*host, LoraSlotView MlpLoraViews::*which, int64_t e) -> Adapter {
        LoraSlot* slot = w.lora.empty() || w.lora[e] == nullptr ? nullptr : w.lora[e]->*host;
        const bool views = !lora_rows[static_cast<size_t>(e)].empty();
        const int64_t begin = gr.offset[static_cast<size_t>(e)], rows = counts[e];
        return {slot,
                views ? &(w.lora_views[static_cast<size_t>(e)].*which) : &no_views,
                slots.adapter ? single_rows(std::vector<int>(adapter_g.begin() + begin,
                                                             adapter_g.begin() + begin + rows))
                              : single_sequence(rows),
                &lora_rows[static_cast<size_t>(e)]};
    };
    // y += the adapters' share of x on projection `which`, each expert on its rows
    auto adapters = [&](LoraSlot* LoraSlots::*host,
                        LoraSlotView MlpLoraViews::*which,
                        const Tensor& x,
                        Tensor& y) {
        each_expert([&](int64_t e, int64_t begin, int64_t rows) {
            const Adapter a = adapter_of(host, which, e);
            if (a.host == nullptr && a.views->empty())
                return;
            Tensor y_rows = y.rows(begin, rows);
            lora_forward(ctx, a.host, *a.views, a.batch, a.rows, x.rows(begin, rows), y_rows);
        });
    };
    // dx += the adapters' share of the input gradient for dy (their gradients accumulate)
    auto adapters_backward = [&](LoraSlot* LoraSlots::*host,
                                 LoraSlotView MlpLoraViews::*which,
                                 const Tensor& x,
                                 const Tensor& dy,
                                 Tensor& dx) {
        each_expert([&](int64_t e, int64_t begin, int64_t rows) {
            const Adapter a = adapter_of(host, which, e);
            if (a.host == nullptr && a.views->empty())
                return;
            Tensor dx_rows = dx.rows(begin, rows);
            lora_backward(ctx,
                          a.host,
                          *a.views,
                          a.batch,
                          a.rows,
                          x.rows(begin, rows),
                          dy.rows(begin, rows),
                          dx_rows);
        });
    };
    // dx (+)= dy · W of each expert's matrix on its rows
    auto input_grad = [&](const std::vector<Tensor>& m, const Tensor& dy, Tensor& dx, float beta) {
        each_expert([&](int64_t e, int64_t begin, int64_t rows) {
            Tensor dx_rows = dx.rows(begin, rows);
            ops::linear_backward(ctx, dy.rows(begin, rows), m[e], dx_rows, beta);
        });
    };

    const auto held =
        std::find_if(w.up.begin(), w.up.end(), [](const Tensor& t) { return t.data != nullptr; });
    HYMOE_CHECK(held != w.up.end(), "experts_grouped_backward: no expert held");
    const int64_t inter = held->dim(0);
    const Shape rows_w{n_rows, width}, rows_i{n_rows, inter};

    // The grouped rows and their weighted output gradients; the forward recomputed.
    Tensor in_g = scratch(DType::f32, rows_w);  // [n_rows, w] rows grouped by expert
    ops::moe_gather(ctx, in, row, k, in_g);
    Tensor d_out_g = scratch(DType::f32, rows_w);  // [n_rows, w] weight · g
    ops::moe_gather_scaled(ctx, g, row, weight, k, d_out_g);
    Tensor up = scratch(DType::f32, rows_i);  // [n_rows, I] x W_upᵀ (+ adapter), then d(up)
    ops::grouped_linear(ctx, in_g, w.up, counts, up);
    adapters(&LoraSlots::up, &MlpLoraViews::up, in_g, up);
    Tensor gate;                             // [n_rows, I] then d(gate); swiglu only
    Tensor h = scratch(DType::f32, rows_i);  // [n_rows, I] act(gate, up)
    if (act == ExpertAct::swiglu) {
        gate = scratch(DType::f32, rows_i);
        ops::grouped_linear(ctx, in_g, w.gate, counts, gate);
        adapters(&LoraSlots::gate, &MlpLoraViews::gate, in_g, gate);
        ops::swiglu(ctx, gate, up, h);
    } else {
        ops::copy_cols(ctx, up, 0, h);
        ops::relu2_inplace(ctx, h);
    }
    Tensor out_g = scratch(DType::f32, rows_w);  // [n_rows, w] the experts' outputs
    ops::grouped_linear(ctx, h, w.down, counts, out_g);
    adapters(&LoraSlots::down, &MlpLoraViews::down, h, out_g);
    poll();

    // The backward: dh = d_out W_down, through the activation, d_in_g = d(up) W_up + d(gate)
    // W_gate.
    Tensor dh = scratch(DType::f32, rows_i);  // [n_rows, I]
    input_grad(w.down, d_out_g, dh, 0.0f);
    adapters_backward(&LoraSlots::down, &MlpLoraViews::down, h, d_out_g, dh);
    if (act == ExpertAct::swiglu)
        ops::swiglu_backward(ctx, gate, up, dh);
    else
        ops::relu2_backward(ctx, up, dh);
    Tensor d_in_g = scratch(DType::f32, rows_w);  // [n_rows, w]
    input_grad(w.up, up, d_in_g, 0.0f);
    adapters_backward(&LoraSlots::up, &MlpLoraViews::up, in_g, up, d_in_g);
    if (act == ExpertAct::swiglu) {
        input_grad(w.gate, gate, d_in_g, 1.0f);
        adapters_backward(&LoraSlots::gate, &MlpLoraViews::gate, in_g, gate, d_in_g);
    }
    poll();

    // Each row's slots summed in slot order; each slot's combine-weight gradient.
    const Tensor ones =
        copied(ctx, scratch, std::vector<float>(static_cast<size_t>(n * k), 1.0f), DType::f32);
    ops::moe_combine(ctx, d_in_g, row, ones, k, d_in);
    ops::moe_slot_dot(ctx, g, out_g, row, k, dw);
}

}  // namespace hymoe::model::detail
