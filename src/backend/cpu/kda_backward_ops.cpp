// The CPU forms of the KDA backward's pieces (hymoe/backend/ops_kda_backward.h): plain fp32 loops,
// the arithmetic model/kda_backward.cpp ran inline before they were ops, in the same order.
#include <algorithm>
#include <cmath>
#include <initializer_list>

#include "hymoe/backend/ops.h"
#include "hymoe/backend/ops_kda_backward.h"
#include "hymoe/core/error.h"

namespace hymoe::ops {

namespace {

void check_f32(std::initializer_list<const Tensor*> ts, const char* op) {
    for (const Tensor* t : ts)
        HYMOE_CHECK(t->dtype == DType::f32 && t->device == Device::cpu,
                    op,
                    ": expected fp32 host tensors, got ",
                    to_string(t->dtype),
                    " on ",
                    to_string(t->device));
}

// The shapes of a per-head op: every tensor of c's size, a whole number of heads of K.
void check_heads(const Tensor& c,
                 int64_t K,
                 std::initializer_list<const Tensor*> ts,
                 const char* op) {
    HYMOE_CHECK(K > 0 && c.numel() % K == 0, op, ": ", shape_string(c.shape), " in heads of ", K);
    for (const Tensor* t : ts)
        HYMOE_CHECK(t->numel() == c.numel(),
                    op,
                    ": ",
                    shape_string(t->shape),
                    " beside ",
                    shape_string(c.shape));
}

}  // namespace

void kda_silu_l2(const Tensor& c, int64_t K, bool l2, float scale, Tensor& out) {
    check_f32({&c, &out}, "kda_silu_l2");
    check_heads(c, K, {&out}, "kda_silu_l2");
    const int64_t n = c.numel();
    float* y = out.ptr<float>();
    for (int64_t i = 0; i < n; ++i)
        y[i] = silu(c.ptr<float>()[i]);
    if (!l2)
        return;
    l2_norm_rows(y, n / K, K);
    for (int64_t i = 0; i < n; ++i)
        y[i] *= scale;
}

void kda_decay_gate_grad(Tensor& g,
                         const Tensor& a_log,
                         const Tensor& dt_bias,
                         std::optional<float> lower_bound,
                         Tensor& dg_dz) {
    check_f32({&g, &a_log, &dt_bias, &dg_dz}, "kda_decay_gate_grad");
    const int64_t H = a_log.numel(), D = dt_bias.numel();
    HYMOE_CHECK(H > 0 && D % H == 0 && g.dim(-1) == D && dg_dz.shape == g.shape,
                "kda_decay_gate_grad: g ",
                shape_string(g.shape),
                " a_log ",
                shape_string(a_log.shape),
                " dt_bias ",
                shape_string(dt_bias.shape),
                " dg_dz ",
                shape_string(dg_dz.shape));
    const int64_t K = D / H, n_tok = g.numel() / D;
    const float* al = a_log.ptr<float>();  // [H]
    const float* bias = dt_bias.ptr<float>();
    for (int64_t t = 0; t < n_tok; ++t) {
        for (int64_t i = 0; i < D; ++i) {
            const float sa = std::exp(al[i / K]);
            float& x = g.ptr<float>()[t * D + i];
            float& dz = dg_dz.ptr<float>()[t * D + i];
            const float z = x + bias[i];
            if (lower_bound) {
                const float lb = *lower_bound;
                const float s = sigmoid(sa * z);
                x = lb * s;
                dz = lb * sa * s * (1.0f - s);
            } else {
                x = -sa * softplus(z);
                dz = -sa * sigmoid(z);
            }
        }
    }
}

void kda_gated_norm_backward(const Tensor& o,
                             const Tensor& nrm,
                             const Tensor& gate,
                             const Tensor& w,
                             float eps,
                             const Tensor& don,
                             Tensor& dO,
                             Tensor& dgate) {
    check_f32({&o, &nrm, &gate, &w, &don, &dO, &dgate}, "kda_gated_norm_backward");
    const int64_t K = w.numel();
    check_heads(o, K, {&nrm, &gate, &don, &dO, &dgate}, "kda_gated_norm_backward");
    const float* on_w = w.ptr<float>();                  // [K]
    for (int64_t row = 0; row < o.numel() / K; ++row) {  // one head of one token
        const float* x = o.ptr<float>() + row * K;
        const float* nr = nrm.ptr<float>() + row * K;
        const float* sg = gate.ptr<float>() + row * K;
        const float* dn = don.ptr<float>() + row * K;
        float* dgt = dgate.ptr<float>() + row * K;
        float* d_o = dO.ptr<float>() + row * K;
        float ss = 0.0f;
        for (int64_t i = 0; i < K; ++i)
            ss += x[i] * x[i];
        const float r = 1.0f / std::sqrt(ss / static_cast<float>(K) + eps);
        float dot = 0.0f;  // Σ dm ⊙ m, m = o r, dm = dnrm ⊙ w
        for (int64_t i = 0; i < K; ++i) {
            dgt[i] = dn[i] * nr[i] * sg[i] * (1.0f - sg[i]);
            d_o[i] = dn[i] * sg[i] * on_w[i];  // dm
            dot += d_o[i] * x[i] * r;
        }
        const float mean = dot / static_cast<float>(K);
        for (int64_t i = 0; i < K; ++i)  // do = r (dm − m·mean(dm ⊙ m))
            d_o[i] = r * (d_o[i] - x[i] * r * mean);
    }
}

void kda_silu_l2_backward(const Tensor& c, int64_t K, bool l2, float scale, Tensor& grad) {
    check_f32({&c, &grad}, "kda_silu_l2_backward");
    check_heads(c, K, {&grad}, "kda_silu_l2_backward");
    for (int64_t row = 0; row < c.numel() / K; ++row) {  // ∂L/∂SiLU(c), then ∂L/∂c
        const float* cr = c.ptr<float>() + row * K;
        float* dr = grad.ptr<float>() + row * K;
        if (l2) {  // y = s·x̃ r: dx̃ = r(dŷ − ŷ(ŷ·dŷ)), ŷ = x̃ r, dŷ = s dy
            float ss = 0.0f, dot = 0.0f;
            for (int64_t i = 0; i < K; ++i)
                ss += silu(cr[i]) * silu(cr[i]);
            const float r = 1.0f / std::sqrt(ss + 1e-6f);
            for (int64_t i = 0; i < K; ++i)
                dot += silu(cr[i]) * r * dr[i] * scale;
            for (int64_t i = 0; i < K; ++i)
                dr[i] = r * (dr[i] * scale - silu(cr[i]) * r * dot);
        }
        for (int64_t i = 0; i < K; ++i) {
            const float sg = sigmoid(cr[i]);
            dr[i] *= sg * (1.0f + cr[i] * (1.0f - sg));
        }
    }
}

void causal_conv_backward(const KdaSeqTable& t, const Tensor& dc, const Tensor& w, Tensor& du) {
    check_f32({&dc, &w, &du}, "causal_conv_backward");
    const int64_t D = dc.dim(-1), W = w.numel() / std::max<int64_t>(1, D);
    HYMOE_CHECK(dc.numel() == t.n_tok * D && du.shape == dc.shape && w.numel() == D * W && W > 0,
                "causal_conv_backward: dc ",
                shape_string(dc.shape),
                " du ",
                shape_string(du.shape),
                " w ",
                shape_string(w.shape),
                ", ",
                t.n_tok,
                " rows");
    float* d = du.ptr<float>();
    const float* g = dc.ptr<float>();
    const float* wp = w.ptr<float>();  // [D, W]
    std::fill_n(d, du.numel(), 0.0f);
    for (int64_t s = 0; s < t.n_seq; ++s) {
        const int64_t r0 = t.offsets[s], T = t.offsets[s + 1] - r0;
        for (int64_t step = 0; step < T; ++step)
            for (int64_t i = 0; i < W; ++i) {
                const int64_t src = step - (W - 1) + i;  // the input step w[·, i] read for step
                if (src < 0)
                    continue;
                for (int64_t ch = 0; ch < D; ++ch)
                    d[(r0 + src) * D + ch] += wp[ch * W + i] * g[(r0 + step) * D + ch];
            }
    }
}

void sigmoid_backward(const Tensor& s, Tensor& d) {
    check_f32({&s, &d}, "sigmoid_backward");
    HYMOE_CHECK(s.numel() == d.numel(),
                "sigmoid_backward: s ",
                shape_string(s.shape),
                " d ",
                shape_string(d.shape));
    for (int64_t i = 0; i < d.numel(); ++i)
        d.ptr<float>()[i] *= s.ptr<float>()[i] * (1.0f - s.ptr<float>()[i]);
}

}  // namespace hymoe::ops
