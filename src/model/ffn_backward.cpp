// Backward of the dense MLP (spec/model-math.md §9) for dense layers, routed experts and shared
// experts, on any Ctx (model/ffn_views.h): the hidden activations are recomputed from x (nothing
// is saved by the forward), then
//   dh = dy W_down,  swiglu: d(gate) = dh ⊙ up ⊙ σ(g)(1 + g(1 − σ(g))), d(up) = dh ⊙ SiLU(g);
//                    relu2:  d(up) = dh ⊙ 2·ReLU(u);
//   dx = d(up) W_up + d(gate) W_gate,
// every step an op on the Ctx. The base weights are frozen; each host adapter slot gets
// lora_backward beside its projection's backward with the forward's input (adapter 0 on every
// row), so dx includes the adapters' share and the adapters accumulate (+=) their gradients. dx is
// overwritten (=).
#include "ffn_backward.h"

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
                        Tensor* y) {
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
    HYMOE_CHECK(ctx.device == Device::cpu || (!host.gate && !host.up && !host.down),
                "dense_ffn_backward: host adapters on a ",
                to_string(ctx.device),
                " context (adapter gradients run on the host only)");
    const SeqBatch rows = single_sequence(n);  // FFN adapters: adapter 0 on every row
    const LoraSlotView no_views;
    auto adapter = [&](const LoraSlot* slot, const Tensor& in, Tensor& out) {
        lora_forward(ctx, slot, no_views, rows, nullptr, in, out);
    };

    // Recompute the forward's hidden activations.
    backend::Scratch scratch(ctx);
    Tensor up = scratch(DType::f32, {n, inter});  // [n, I] x W_upᵀ (+ adapter), then d(up)
    ops::linear(ctx, x, w.up_proj, up);
    adapter(host.up, x, up);
    Tensor gate;  // [n, I] x W_gateᵀ (+ adapter), then d(gate); swiglu only
    Tensor h =
        scratch(DType::f32, {n, inter});  // [n, I] act(gate, up): the down projection's input
    if (act == ExpertAct::swiglu) {
        gate = scratch(DType::f32, {n, inter});
        ops::linear(ctx, x, w.gate_proj, gate);
        adapter(host.gate, x, gate);
        ops::swiglu(ctx, gate, up, h);
    } else {
        ops::copy_cols(ctx, up, 0, h);
        ops::relu2_inplace(ctx, h);
    }
    if (y) {
        ops::linear(ctx, h, w.down_proj, *y);
        adapter(host.down, h, *y);
    }

    // dh [n, I] = dy [n, w] · W_down [w, I], plus the down adapter's share.
    Tensor dh = scratch(DType::f32, {n, inter});
    ops::linear_backward(ctx, dy, w.down_proj, dh);
    lora_backward(host.down, rows, h, dy, dh);

    // Through the activation, in place: up ← d(up), gate ← d(gate).
    if (act == ExpertAct::swiglu)
        ops::swiglu_backward(ctx, gate, up, dh);
    else
        ops::relu2_backward(ctx, up, dh);

    // dx [n, w] = d(up) W_up (+ d(gate) W_gate), plus the adapters' shares.
    ops::linear_backward(ctx, up, w.up_proj, dx);
    lora_backward(host.up, rows, x, up, dx);
    if (act == ExpertAct::swiglu) {
        ops::linear_backward(ctx, gate, w.gate_proj, dx, 1.0f);
        lora_backward(host.gate, rows, x, gate, dx);
    }
}

namespace detail {

void dense_ffn_backward_with_output(const DenseFfnWeights& w,
                                    ExpertAct act,
                                    const Tensor& x,
                                    const Tensor& dy,
                                    Tensor& dx,
                                    Tensor* y) {
    dense_ffn_backward(backend::cpu_ctx(), ffn_views(w), act, x, dy, dx, y);
}

}  // namespace detail

void dense_ffn_backward(
    const DenseFfnWeights& w, ExpertAct act, const Tensor& x, const Tensor& dy, Tensor& dx) {
    dense_ffn_backward(backend::cpu_ctx(), ffn_views(w), act, x, dy, dx, nullptr);
}

}  // namespace hymoe::model
