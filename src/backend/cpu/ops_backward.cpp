// The CPU reference of backend/ops_backward.h: plain loops (row statistics in double), BLAS for
// the matrix product, AdamW in double. Shapes are checked here, once per call.
#include "hymoe/backend/ops_backward.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "hymoe/core/error.h"

namespace hymoe::ops {

void rms_norm_backward(const Tensor& x, const Tensor& w, float eps, const Tensor& dy, Tensor& dx) {
    const int64_t dim = x.dim(-1), rows = x.numel() / std::max<int64_t>(dim, 1);
    HYMOE_CHECK(w.numel() == dim && dy.numel() == x.numel() && dx.numel() == x.numel(),
                "rms_norm_backward: x ",
                shape_string(x.shape),
                " w ",
                shape_string(w.shape),
                " dy ",
                shape_string(dy.shape),
                " dx ",
                shape_string(dx.shape));
    const float* wp = w.ptr<float>();
    for (int64_t r = 0; r < rows; ++r) {
        const float* xr = x.ptr<float>() + r * dim;
        const float* gr = dy.ptr<float>() + r * dim;
        float* dr = dx.ptr<float>() + r * dim;
        double ss = 0, dot = 0;  // Σ x², Σ dy·w·x
        for (int64_t i = 0; i < dim; ++i) {
            const double xi = xr[i];
            ss += xi * xi;
            dot += static_cast<double>(gr[i]) * static_cast<double>(wp[i]) * xi;
        }
        const double inv =
            1.0 / std::sqrt(ss / static_cast<double>(dim) + static_cast<double>(eps));
        // mean(dn ⊙ n) = r·Σ(dy·w·x)/dim; dx = r·dn − x·r³·Σ(dy·w·x)/dim
        const double c = inv * inv * inv * dot / static_cast<double>(dim);
        for (int64_t i = 0; i < dim; ++i)
            dr[i] =
                static_cast<float>(inv * static_cast<double>(gr[i]) * static_cast<double>(wp[i]) -
                                   c * static_cast<double>(xr[i]));
    }
}

void linear_backward(const Tensor& dy, const Tensor& w, Tensor& dx, float beta) {
    const int64_t out = w.dim(0), in = w.dim(1), n = dy.numel() / std::max<int64_t>(out, 1);
    HYMOE_CHECK(
        w.shape.size() == 2 && dy.dim(-1) == out && dx.dim(-1) == in && dx.numel() == n * in,
        "linear_backward: dy ",
        shape_string(dy.shape),
        " w ",
        shape_string(w.shape),
        " dx ",
        shape_string(dx.shape));
    gemm_w(false,
           n,
           in,
           out,
           1.0f,
           dy.ptr<float>(),
           out,
           weight_ref(w),
           in,
           beta,
           dx.ptr<float>(),
           in);
}

void softmax_rows_backward(const float* p, float* dp, int64_t rows, int64_t n) {
    for (int64_t r = 0; r < rows; ++r) {
        const float* pr = p + r * n;
        float* gr = dp + r * n;
        double dot = 0;
        for (int64_t i = 0; i < n; ++i)
            dot += static_cast<double>(pr[i]) * static_cast<double>(gr[i]);
        const auto s = static_cast<float>(dot);
        for (int64_t i = 0; i < n; ++i)
            gr[i] = pr[i] * (gr[i] - s);
    }
}

void rope_backward(float* dx,
                   int64_t n_tok,
                   int64_t n_head,
                   int64_t token_stride,
                   int64_t head_stride,
                   const int64_t* pos,
                   const RopeFreqs& freqs,
                   bool interleaved) {
    std::vector<int64_t> back(pos, pos + n_tok);  // R(pos·θ)ᵀ = R(−pos·θ)
    for (int64_t& p : back)
        p = -p;
    rope(dx, n_tok, n_head, token_stride, head_stride, back.data(), freqs, interleaved);
}

namespace {

void check_same(const char* op, const Tensor& a, const Tensor& b) {
    HYMOE_CHECK(a.dtype == DType::f32 && b.dtype == DType::f32 && a.numel() == b.numel(),
                op,
                ": ",
                to_string(a.dtype),
                " ",
                shape_string(a.shape),
                " and ",
                to_string(b.dtype),
                " ",
                shape_string(b.shape),
                " (f32 of one size)");
}

}  // namespace

void swiglu_backward(Tensor& gate, Tensor& up, const Tensor& dh) {
    check_same("swiglu_backward", gate, up);
    check_same("swiglu_backward", gate, dh);
    float* g = gate.ptr<float>();
    float* u = up.ptr<float>();
    const float* g_h = dh.ptr<float>();
    for (int64_t i = 0; i < gate.numel(); ++i) {
        const float sg = sigmoid(g[i]);
        const float d_gate = g_h[i] * u[i] * sg * (1.0f + g[i] * (1.0f - sg));
        u[i] = g_h[i] * g[i] * sg;
        g[i] = d_gate;
    }
}

void relu2_backward(Tensor& up, const Tensor& dh) {
    check_same("relu2_backward", up, dh);
    float* u = up.ptr<float>();
    const float* g_h = dh.ptr<float>();
    for (int64_t i = 0; i < up.numel(); ++i)
        u[i] = g_h[i] * 2.0f * std::max(u[i], 0.0f);
}

void sigmoid_gate_backward(Tensor& du, const Tensor& o, const Tensor& g, Tensor& dz) {
    check_same("sigmoid_gate_backward", du, o);
    check_same("sigmoid_gate_backward", du, g);
    check_same("sigmoid_gate_backward", du, dz);
    float* dup = du.ptr<float>();
    const float* op = o.ptr<float>();
    const float* gp = g.ptr<float>();
    float* dzp = dz.ptr<float>();
    for (int64_t i = 0; i < du.numel(); ++i) {
        dzp[i] = dup[i] * op[i] * gp[i] * (1.0f - gp[i]);
        dup[i] *= gp[i];
    }
}

void adamw(Tensor& p, const Tensor& g, Tensor& m, Tensor& v, const AdamWStep& s) {
    check_same("adamw", p, g);
    check_same("adamw", p, m);
    check_same("adamw", p, v);
    float* pp = p.ptr<float>();
    const float* gp = g.ptr<float>();
    float* mp = m.ptr<float>();
    float* vp = v.ptr<float>();
    for (int64_t k = 0; k < p.numel(); ++k) {
        const double gk = s.grad_scale * static_cast<double>(gp[k]);
        mp[k] = static_cast<float>(s.beta1 * static_cast<double>(mp[k]) + (1.0 - s.beta1) * gk);
        vp[k] =
            static_cast<float>(s.beta2 * static_cast<double>(vp[k]) + (1.0 - s.beta2) * gk * gk);
        const double update = (static_cast<double>(mp[k]) / s.c1) /
                              (std::sqrt(static_cast<double>(vp[k]) / s.c2) + s.eps);
        pp[k] = static_cast<float>(static_cast<double>(pp[k]) * (1.0 - s.lr * s.weight_decay) -
                                   s.lr * update);
    }
}

}  // namespace hymoe::ops
