// Backward of the dense MLP (spec/model-math.md §9) for dense layers, routed experts and shared
// experts, on any Ctx (model/ffn_views.h): the hidden activations are recomputed from x (nothing
// is saved by the forward), then
//   dh = dy W_down,  swiglu: d(gate) = dh ⊙ up ⊙ σ(g)(1 + g(1 − σ(g))), d(up) = dh ⊙ SiLU(g);
//                    relu2:  d(up) = dh ⊙ 2·ReLU(u);
//   dx = d(up) W_up + d(gate) W_gate,
// every step an op on the Ctx. The base weights are frozen; each projection's adapters (the host
// slot, adapter 0 on every row, and the factor views on their rows) get lora_backward beside its
// backward with the forward's input (model/lora_views.h), so dx includes the adapters' share and
// the adapters accumulate (+=) their gradients. dx is overwritten (=).
#include "hymoe/backend/ops.h"
#include "hymoe/backend/ops_attention.h"
#include "hymoe/backend/ops_backward.h"
#include "hymoe/core/error.h"
#include "hymoe/model/ffn.h"
#include "hymoe/model/ffn_views.h"
#include "hymoe/model/lora.h"

namespace hymoe::model {

void dense_ffn_backward(const backend::Ctx& ctx,
                        const DenseFfnViews& w,
                        ExpertAct act,
                        const Tensor& x,
                        const Tensor& dy,
                        Tensor& dx,
                        const std::vector<LoraRowsView>* lora_rows) {
    const int64_t n = x.dim(0);
    const int64_t inter = w.up_proj.dim(0);
    HYMOE_CHECK(
        dy.shape == x.shape && dx.shape == x.shape && dx.data != x.data && dx.data != dy.data,
        "dense_ffn_backward: x ",
        shape_string(x.shape),
        " dy ",
        shape_string(dy.shape),
        " dx ",
        shape_string(dx.shape),
        " (dx must not alias x or dy)");
    const LoraSlots none;
    const LoraSlots& host = w.lora ? *w.lora : none;
    const MlpLoraViews& views = w.lora_views;
    const SeqBatch rows = single_sequence(n);  // FFN host adapters: adapter 0 on every row
    auto adapter = [&](const LoraSlot* slot, const LoraSlotView& f, const Tensor& in, Tensor& out) {
        lora_forward(ctx, slot, f, rows, lora_rows, in, out);
    };
    auto adapter_backward = [&](LoraSlot* slot,
                                const LoraSlotView& f,
                                const Tensor& in,
                                const Tensor& d_out,
                                Tensor& d_in) {
        lora_backward(ctx, slot, f, rows, lora_rows, in, d_out, d_in);
    };

    // Recompute the forward's hidden activations.
    backend::Scratch scratch(ctx);
    Tensor up = scratch(DType::f32, {n, inter});  // [n, I] x W_upᵀ (+ adapter), then d(up)
    ops::linear(ctx, x, w.up_proj, up);
    adapter(host.up, views.up, x, up);
    Tensor gate;  // [n, I] x W_gateᵀ (+ adapter), then d(gate); swiglu only
    Tensor h =
        scratch(DType::f32, {n, inter});  // [n, I] act(gate, up): the down projection's input
    if (act == ExpertAct::swiglu) {
        gate = scratch(DType::f32, {n, inter});
        ops::linear(ctx, x, w.gate_proj, gate);
        adapter(host.gate, views.gate, x, gate);
        ops::swiglu(ctx, gate, up, h);
    } else {
        ops::copy_cols(ctx, up, 0, h);
        ops::relu2_inplace(ctx, h);
    }

    // dh [n, I] = dy [n, w] · W_down [w, I], plus the down adapter's share.
    Tensor dh = scratch(DType::f32, {n, inter});
    ops::linear_backward(ctx, dy, w.down_proj, dh);
    adapter_backward(host.down, views.down, h, dy, dh);

    // Through the activation, in place: up ← d(up), gate ← d(gate).
    if (act == ExpertAct::swiglu)
        ops::swiglu_backward(ctx, gate, up, dh);
    else
        ops::relu2_backward(ctx, up, dh);

    // dx [n, w] = d(up) W_up (+ d(gate) W_gate), plus the adapters' shares.
    ops::linear_backward(ctx, up, w.up_proj, dx);
    adapter_backward(host.up, views.up, x, up, dx);
    if (act == ExpertAct::swiglu) {
        ops::linear_backward(ctx, gate, w.gate_proj, dx, 1.0f);
        adapter_backward(host.gate, views.gate, x, gate, dx);
    }
}

void dense_ffn_backward(
    const DenseFfnWeights& w, ExpertAct act, const Tensor& x, const Tensor& dy, Tensor& dx) {
    dense_ffn_backward(backend::cpu_ctx(), ffn_views(w), act, x, dy, dx);
}

}  // namespace hymoe::model
