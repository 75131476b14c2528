// Backward of the dense MLP (spec/model-math.md §9) for dense layers, routed experts and shared
// experts: the hidden activations are recomputed from x (nothing is saved by the forward), then
//   dh = dy W_down,  swiglu: d(gate) = dh ⊙ up ⊙ σ(g)(1 + g(1 − σ(g))), d(up) = dh ⊙ SiLU(g);
//                    relu2:  d(up) = dh ⊙ 2·ReLU(u);
//   dx = d(up) W_up + d(gate) W_gate.
// The base weights are frozen; each adapter slot gets lora_backward beside its projection's
// backward with the forward's input (adapter 0 on every row), so dx includes the adapters' share
// and the adapters accumulate (+=) their gradients. dx is overwritten (=).
#include "ffn_backward.h"

#include <algorithm>

#include "hymoe/backend/ops.h"
#include "hymoe/core/error.h"
#include "hymoe/model/ffn.h"

namespace hymoe::model {

namespace detail {

void dense_ffn_backward_with_output(const DenseFfnWeights& w,
                                    ExpertAct act,
                                    const Tensor& x,
                                    const Tensor& dy,
                                    Tensor& dx,
                                    Tensor* y) {
    const int64_t n = x.dim(0), width = x.dim(1);
    const int64_t inter = w.up_proj.view().dim(0);
    HYMOE_CHECK(
        dy.shape == x.shape && dx.shape == x.shape && dx.data != x.data && dx.data != dy.data,
        "dense_ffn_backward: x ",
        shape_string(x.shape),
        " dy ",
        shape_string(dy.shape),
        " dx ",
        shape_string(dx.shape),
        " (dx must not alias x or dy)");
    const SeqBatch rows = single_sequence(n);  // FFN adapters: adapter 0 on every row

    // Recompute the forward's hidden activations.
    Buffer up(DType::f32, {n, inter});  // [n, I] x W_upᵀ (+ adapter), then d(up)
    ops::linear(x, w.up_proj.view(), up.view());
    lora_forward(w.lora.up, rows, x, up.view());
    Buffer gate;                       // [n, I] x W_gateᵀ (+ adapter), then d(gate); swiglu only
    Buffer h(DType::f32, {n, inter});  // [n, I] act(gate, up): the down projection's input
    if (act == ExpertAct::swiglu) {
        gate = Buffer(DType::f32, {n, inter});
        ops::linear(x, w.gate_proj.view(), gate.view());
        lora_forward(w.lora.gate, rows, x, gate.view());
        ops::swiglu(gate.view(), up.view(), h.view());
    } else {
        for (int64_t i = 0; i < n * inter; ++i) {
            const float r = std::max(up.ptr<float>()[i], 0.0f);
            h.ptr<float>()[i] = r * r;
        }
    }
    if (y) {
        ops::linear(h.view(), w.down_proj.view(), *y);
        lora_forward(w.lora.down, rows, h.view(), *y);
    }

    // dh [n, I] = dy [n, w] · W_down [w, I], plus the down adapter's share.
    Buffer dh(DType::f32, {n, inter});
    ops::gemm_w(false,
                n,
                inter,
                width,
                1.0f,
                dy.ptr<float>(),
                width,
                ops::weight_ref(w.down_proj.view()),
                inter,
                0.0f,
                dh.ptr<float>(),
                inter);
    lora_backward(w.lora.down, rows, h.view(), dy, dh.view());

    // Through the activation, in place: up ← d(up), gate ← d(gate).
    float* u = up.ptr<float>();
    const float* g_h = dh.ptr<float>();
    if (act == ExpertAct::swiglu) {
        float* g = gate.ptr<float>();
        for (int64_t i = 0; i < n * inter; ++i) {
            const float sg = ops::sigmoid(g[i]);
            const float d_gate = g_h[i] * u[i] * sg * (1.0f + g[i] * (1.0f - sg));
            u[i] = g_h[i] * g[i] * sg;
            g[i] = d_gate;
        }
    } else {
        for (int64_t i = 0; i < n * inter; ++i)
            u[i] = g_h[i] * 2.0f * std::max(u[i], 0.0f);
    }

    // dx [n, w] = d(up) W_up (+ d(gate) W_gate), plus the adapters' shares.
    ops::gemm_w(false,
                n,
                width,
                inter,
                1.0f,
                u,
                inter,
                ops::weight_ref(w.up_proj.view()),
                width,
                0.0f,
                dx.ptr<float>(),
                width);
    lora_backward(w.lora.up, rows, x, up.view(), dx);
    if (act == ExpertAct::swiglu) {
        ops::gemm_w(false,
                    n,
                    width,
                    inter,
                    1.0f,
                    gate.ptr<float>(),
                    inter,
                    ops::weight_ref(w.gate_proj.view()),
                    width,
                    1.0f,
                    dx.ptr<float>(),
                    width);
        lora_backward(w.lora.gate, rows, x, gate.view(), dx);
    }
}

}  // namespace detail

void dense_ffn_backward(
    const DenseFfnWeights& w, ExpertAct act, const Tensor& x, const Tensor& dy, Tensor& dx) {
    detail::dense_ffn_backward_with_output(w, act, x, dy, dx, nullptr);
}

}  // namespace hymoe::model
