// The KDA backward pieces' kernels (hymoe/backend/cuda_kda_backward.h), fp32: grid-stride loops
// over elements, and over head rows of K values (one thread a row, its sums sequential in the
// CPU forms' order) where a row sum is needed. expf, not __expf, in σ and SiLU, as elementwise.cu.
#include <initializer_list>

#include "hymoe/backend/cuda_kda_backward.h"
#include "kernels.h"

namespace hymoe::backend::cuda {

namespace {

__device__ inline float sig(float x) {
    return 1.0f / (1.0f + expf(-x));
}
__device__ inline float silu_f(float x) {
    return x * sig(x);
}

#define GRID_STRIDE(i, n)                                                                  \
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
         i += static_cast<int64_t>(gridDim.x) * blockDim.x)

// One thread per head row: y = SiLU(c); with l2, y ← y / √(Σ y² + 1e-6) (Σ in double, as
// ops::l2_norm_rows) · scale.
__global__ void silu_l2_kernel(
    const float* c, int64_t rows, int64_t K, bool l2, float scale, float* y) {
    GRID_STRIDE(row, rows) {
        const float* cr = c + row * K;
        float* yr = y + row * K;
        double ss = 0;
        for (int64_t i = 0; i < K; ++i) {
            yr[i] = silu_f(cr[i]);
            ss += static_cast<double>(yr[i]) * static_cast<double>(yr[i]);
        }
        if (!l2)
            continue;
        const float inv = 1.0f / sqrtf(static_cast<float>(ss) + 1e-6f);
        for (int64_t i = 0; i < K; ++i)
            yr[i] = yr[i] * inv * scale;
    }
}

__global__ void decay_gate_grad_kernel(float* g,
                                       const float* a_log,
                                       const float* dt_bias,
                                       int64_t n,
                                       int64_t D,
                                       int64_t K,
                                       bool has_lb,
                                       float lb,
                                       float* dz) {
    GRID_STRIDE(j, n) {
        const int64_t i = j % D;
        const float sa = expf(a_log[i / K]);
        const float z = g[j] + dt_bias[i];
        if (has_lb) {
            const float s = sig(sa * z);
            g[j] = lb * s;
            dz[j] = lb * sa * s * (1.0f - s);
        } else {
            g[j] = -sa * (z > 20.0f ? z : log1pf(expf(z)));
            dz[j] = -sa * sig(z);
        }
    }
}

// One thread per head row: the output gate's and RMSNorm's backward.
__global__ void gated_norm_backward_kernel(const float* o,
                                           const float* nrm,
                                           const float* gate,
                                           const float* w,
                                           float eps,
                                           const float* don,
                                           int64_t rows,
                                           int64_t K,
                                           float* dO,
                                           float* dgate) {
    GRID_STRIDE(row, rows) {
        const int64_t off = row * K;
        float ss = 0.0f;
        for (int64_t i = 0; i < K; ++i)
            ss += o[off + i] * o[off + i];
        const float r = 1.0f / sqrtf(ss / static_cast<float>(K) + eps);
        float dot = 0.0f;
        for (int64_t i = 0; i < K; ++i) {
            const float sg = gate[off + i];
            dgate[off + i] = don[off + i] * nrm[off + i] * sg * (1.0f - sg);
            dO[off + i] = don[off + i] * sg * w[i];
            dot += dO[off + i] * o[off + i] * r;
        }
        const float mean = dot / static_cast<float>(K);
        for (int64_t i = 0; i < K; ++i)
            dO[off + i] = r * (dO[off + i] - o[off + i] * r * mean);
    }
}

// One thread per head row: through the l2 norm (with its scale), then SiLU.
__global__ void silu_l2_backward_kernel(
    const float* c, int64_t rows, int64_t K, bool l2, float scale, float* grad) {
    GRID_STRIDE(row, rows) {
        const float* cr = c + row * K;
        float* dr = grad + row * K;
        if (l2) {
            float ss = 0.0f, dot = 0.0f;
            for (int64_t i = 0; i < K; ++i)
                ss += silu_f(cr[i]) * silu_f(cr[i]);
            const float r = 1.0f / sqrtf(ss + 1e-6f);
            for (int64_t i = 0; i < K; ++i)
                dot += silu_f(cr[i]) * r * dr[i] * scale;
            for (int64_t i = 0; i < K; ++i)
                dr[i] = r * (dr[i] * scale - silu_f(cr[i]) * r * dot);
        }
        for (int64_t i = 0; i < K; ++i) {
            const float sg = sig(cr[i]);
            dr[i] *= sg * (1.0f + cr[i] * (1.0f - sg));
        }
    }
}

// du [row, ch] = Σ_i w[ch, i] dc[row + W−1−i, ch] over the rows of row's sequence (i from W−1
// down, the CPU form's order).
__global__ void conv_backward_kernel(const float* dc,
                                     const float* w,
                                     const int64_t* offsets,
                                     const int32_t* row_seq,
                                     int64_t n_tok,
                                     int64_t D,
                                     int64_t W,
                                     float* du) {
    GRID_STRIDE(j, n_tok * D) {
        const int64_t row = j / D, ch = j % D;
        const int64_t end = offsets[row_seq[row] + 1];
        float acc = 0.0f;
        for (int64_t i = W - 1; i >= 0; --i) {
            const int64_t step = row + (W - 1) - i;
            if (step < end)
                acc += w[ch * W + i] * dc[step * D + ch];
        }
        du[j] = acc;
    }
}

__global__ void sigmoid_backward_kernel(const float* s, int64_t n, float* d) {
    GRID_STRIDE(i, n) {
        d[i] *= s[i] * (1.0f - s[i]);
    }
}

void check_same(const Tensor& a, const Tensor& b, const char* op) {
    check_float(a, op, DType::f32);
    check_float(b, op, DType::f32);
    HYMOE_CHECK(
        a.numel() == b.numel(), op, ": ", shape_string(a.shape), " beside ", shape_string(b.shape));
}

void check_heads(const Tensor& c, int64_t K, const char* op) {
    HYMOE_CHECK(K > 0 && c.numel() % K == 0, op, ": ", shape_string(c.shape), " in heads of ", K);
}

}  // namespace

void kda_silu_l2(const Stream& s, const Tensor& c, int64_t K, bool l2, float scale, Tensor& out) {
    check_same(c, out, "kda_silu_l2");
    check_heads(c, K, "kda_silu_l2");
    const int64_t rows = c.numel() / K;
    if (rows == 0)
        return;
    silu_l2_kernel<<<grid_for(rows, kBlock), kBlock, 0, s.get()>>>(
        c.ptr<float>(), rows, K, l2, scale, out.ptr<float>());
    check_launch("kda_silu_l2");
}

void kda_decay_gate_grad(const Stream& s,
                         Tensor& g,
                         const Tensor& a_log,
                         const Tensor& dt_bias,
                         bool has_lower_bound,
                         float lower_bound,
                         Tensor& dg_dz) {
    check_same(g, dg_dz, "kda_decay_gate_grad");
    check_float(a_log, "kda_decay_gate_grad", DType::f32);
    check_float(dt_bias, "kda_decay_gate_grad", DType::f32);
    const int64_t H = a_log.numel(), D = dt_bias.numel();
    HYMOE_CHECK(H > 0 && D % H == 0 && g.dim(-1) == D,
                "kda_decay_gate_grad: g ",
                shape_string(g.shape),
                " a_log ",
                shape_string(a_log.shape),
                " dt_bias ",
                shape_string(dt_bias.shape));
    const int64_t n = g.numel();
    if (n == 0)
        return;
    decay_gate_grad_kernel<<<grid_for(n, kBlock), kBlock, 0, s.get()>>>(g.ptr<float>(),
                                                                        a_log.ptr<float>(),
                                                                        dt_bias.ptr<float>(),
                                                                        n,
                                                                        D,
                                                                        D / H,
                                                                        has_lower_bound,
                                                                        lower_bound,
                                                                        dg_dz.ptr<float>());
    check_launch("kda_decay_gate_grad");
}

void kda_gated_norm_backward(const Stream& s,
                             const Tensor& o,
                             const Tensor& nrm,
                             const Tensor& gate,
                             const Tensor& w,
                             float eps,
                             const Tensor& don,
                             Tensor& dO,
                             Tensor& dgate) {
    const char* op = "kda_gated_norm_backward";
    for (const Tensor* t : std::initializer_list<const Tensor*>{&nrm, &gate, &don, &dO, &dgate})
        check_same(o, *t, op);
    check_float(w, op, DType::f32);
    const int64_t K = w.numel();
    check_heads(o, K, op);
    const int64_t rows = o.numel() / K;
    if (rows == 0)
        return;
    gated_norm_backward_kernel<<<grid_for(rows, kBlock), kBlock, 0, s.get()>>>(o.ptr<float>(),
                                                                               nrm.ptr<float>(),
                                                                               gate.ptr<float>(),
                                                                               w.ptr<float>(),
                                                                               eps,
                                                                               don.ptr<float>(),
                                                                               rows,
                                                                               K,
                                                                               dO.ptr<float>(),
                                                                               dgate.ptr<float>());
    check_launch(op);
}

void kda_silu_l2_backward(
    const Stream& s, const Tensor& c, int64_t K, bool l2, float scale, Tensor& grad) {
    check_same(c, grad, "kda_silu_l2_backward");
    check_heads(c, K, "kda_silu_l2_backward");
    const int64_t rows = c.numel() / K;
    if (rows == 0)
        return;
    silu_l2_backward_kernel<<<grid_for(rows, kBlock), kBlock, 0, s.get()>>>(
        c.ptr<float>(), rows, K, l2, scale, grad.ptr<float>());
    check_launch("kda_silu_l2_backward");
}

void causal_conv_backward(
    const Stream& s, const ops::KdaSeqTable& t, const Tensor& dc, const Tensor& w, Tensor& du) {
    check_same(dc, du, "causal_conv_backward");
    check_float(w, "causal_conv_backward", DType::f32);
    const int64_t D = dc.dim(-1), W = D > 0 ? w.numel() / D : 0;
    HYMOE_CHECK(dc.numel() == t.n_tok * D && w.numel() == D * W && W > 0 && t.row_seq != nullptr &&
                    t.offsets != nullptr,
                "causal_conv_backward: dc ",
                shape_string(dc.shape),
                " w ",
                shape_string(w.shape),
                ", ",
                t.n_tok,
                " rows (a table with its device offsets and row_seq)");
    if (t.n_tok * D == 0)
        return;
    conv_backward_kernel<<<grid_for(t.n_tok * D, kBlock), kBlock, 0, s.get()>>>(
        dc.ptr<float>(), w.ptr<float>(), t.offsets, t.row_seq, t.n_tok, D, W, du.ptr<float>());
    check_launch("causal_conv_backward");
}

void sigmoid_backward(const Stream& s, const Tensor& sg, Tensor& d) {
    check_same(sg, d, "sigmoid_backward");
    const int64_t n = d.numel();
    if (n == 0)
        return;
    sigmoid_backward_kernel<<<grid_for(n, kBlock), kBlock, 0, s.get()>>>(
        sg.ptr<float>(), n, d.ptr<float>());
    check_launch("sigmoid_backward");
}

}  // namespace hymoe::backend::cuda
