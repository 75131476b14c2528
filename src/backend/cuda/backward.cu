// The backward ops' and AdamW's kernels (hymoe/backend/cuda_backward.h), fp32: grid-stride
// elementwise loops, and one block per row where a row's sum is needed (reduced in double, as
// the CPU forms). expf, not __expf, in σ, as elementwise.cu.
#include "hymoe/backend/cuda_backward.h"
#include "kernels.h"

namespace hymoe::backend::cuda {

namespace {

__device__ inline float sigmoid_f(float x) {
    return 1.0f / (1.0f + expf(-x));
}

// The sum of v over the block (blockDim.x = kBlock), returned to every thread.
__device__ double block_sum_d(double v) {
    __shared__ double part[kBlock];
    __syncthreads();  // an earlier call's readers are done with part
    part[threadIdx.x] = v;
    __syncthreads();
    for (int o = kBlock / 2; o > 0; o >>= 1) {
        if (static_cast<int>(threadIdx.x) < o)
            part[threadIdx.x] += part[threadIdx.x + o];
        __syncthreads();
    }
    return part[0];
}

#define GRID_STRIDE(i, n)                                                                  \
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
         i += static_cast<int64_t>(gridDim.x) * blockDim.x)

// One block per row of dim: dx = r·dy·w − x·r³·Σ(dy·w·x)/dim.
__global__ void rms_norm_backward_kernel(
    const float* x, const float* w, float eps, const float* dy, float* dx, int64_t dim) {
    const int64_t off = blockIdx.x * dim;
    double ss = 0, dot = 0;
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
        const double xi = x[off + i];
        ss += xi * xi;
        dot += static_cast<double>(dy[off + i]) * static_cast<double>(w[i]) * xi;
    }
    ss = block_sum_d(ss);
    dot = block_sum_d(dot);
    const double inv = 1.0 / sqrt(ss / static_cast<double>(dim) + static_cast<double>(eps));
    const double c = inv * inv * inv * dot / static_cast<double>(dim);
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x)
        dx[off + i] =
            static_cast<float>(inv * static_cast<double>(dy[off + i]) * static_cast<double>(w[i]) -
                               c * static_cast<double>(x[off + i]));
}

// One block per row of n: dp ← p ⊙ (dp − Σ p dp).
__global__ void softmax_backward_kernel(const float* p, float* dp, int64_t n) {
    const int64_t off = blockIdx.x * n;
    double dot = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
        dot += static_cast<double>(p[off + i]) * static_cast<double>(dp[off + i]);
    const auto s = static_cast<float>(block_sum_d(dot));
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
        dp[off + i] = p[off + i] * (dp[off + i] - s);
}

__global__ void negate_kernel(const int64_t* src, int64_t* dst, int64_t n) {
    GRID_STRIDE(i, n) dst[i] = -src[i];
}

__global__ void swiglu_backward_kernel(float* g, float* u, const float* dh, int64_t n) {
    GRID_STRIDE(i, n) {
        const float sg = sigmoid_f(g[i]);
        const float d_gate = dh[i] * u[i] * sg * (1.0f + g[i] * (1.0f - sg));
        u[i] = dh[i] * g[i] * sg;
        g[i] = d_gate;
    }
}

__global__ void relu2_backward_kernel(float* u, const float* dh, int64_t n) {
    GRID_STRIDE(i, n) u[i] = dh[i] * 2.0f * fmaxf(u[i], 0.0f);
}

__global__ void sigmoid_gate_backward_kernel(
    float* du, const float* o, const float* g, float* dz, int64_t n) {
    GRID_STRIDE(i, n) {
        dz[i] = du[i] * o[i] * g[i] * (1.0f - g[i]);
        du[i] *= g[i];
    }
}

__global__ void adamw_kernel(
    float* p, const float* g, float* m, float* v, ops::AdamWStep s, int64_t n) {
    GRID_STRIDE(k, n) {
        const double gk = s.grad_scale * static_cast<double>(g[k]);
        m[k] = static_cast<float>(s.beta1 * static_cast<double>(m[k]) + (1.0 - s.beta1) * gk);
        v[k] = static_cast<float>(s.beta2 * static_cast<double>(v[k]) + (1.0 - s.beta2) * gk * gk);
        const double update =
            (static_cast<double>(m[k]) / s.c1) / (sqrt(static_cast<double>(v[k]) / s.c2) + s.eps);
        p[k] = static_cast<float>(static_cast<double>(p[k]) * (1.0 - s.lr * s.weight_decay) -
                                  s.lr * update);
    }
}

#undef GRID_STRIDE

// Device f32 tensors of one size.
void check_f32(const char* op, std::initializer_list<const Tensor*> ts) {
    const Tensor& a = **ts.begin();
    for (const Tensor* t : ts) {
        check_float(*t, op, DType::f32);
        HYMOE_CHECK(t->numel() == a.numel(),
                    op,
                    ": ",
                    shape_string(t->shape),
                    " against ",
                    shape_string(a.shape));
    }
}

}  // namespace

void rms_norm_backward(
    const Stream& s, const Tensor& x, const Tensor& w, float eps, const Tensor& dy, Tensor& dx) {
    check_f32("rms_norm_backward", {&x, &dy, &dx});
    check_float(w, "rms_norm_backward", DType::f32);
    const int64_t dim = x.dim(-1), rows = rows_of(x);
    HYMOE_CHECK(
        w.numel() == dim, "rms_norm_backward: w ", shape_string(w.shape), " for rows of ", dim);
    if (rows == 0)
        return;
    rms_norm_backward_kernel<<<static_cast<unsigned>(rows), kBlock, 0, s.get()>>>(
        x.ptr<float>(), w.ptr<float>(), eps, dy.ptr<float>(), dx.ptr<float>(), dim);
    check_launch("rms_norm_backward");
}

void softmax_rows_backward(const Stream& s, const Tensor& p, Tensor& dp) {
    check_f32("softmax_rows_backward", {&p, &dp});
    const int64_t rows = rows_of(p);
    if (rows == 0)
        return;
    softmax_backward_kernel<<<static_cast<unsigned>(rows), kBlock, 0, s.get()>>>(
        p.ptr<float>(), dp.ptr<float>(), p.dim(-1));
    check_launch("softmax_rows_backward");
}

void negate_i64(const Stream& s, const Tensor& src, Tensor& dst) {
    HYMOE_CHECK(src.device == Device::cuda && dst.device == Device::cuda &&
                    src.dtype == DType::i64 && dst.dtype == DType::i64 &&
                    src.numel() == dst.numel(),
                "negate_i64: ",
                to_string(src.dtype),
                shape_string(src.shape),
                " into ",
                to_string(dst.dtype),
                shape_string(dst.shape));
    const int64_t n = src.numel();
    if (n == 0)
        return;
    negate_kernel<<<grid_for(n, kBlock), kBlock, 0, s.get()>>>(
        src.ptr<int64_t>(), dst.ptr<int64_t>(), n);
    check_launch("negate_i64");
}

void swiglu_backward(const Stream& s, Tensor& gate, Tensor& up, const Tensor& dh) {
    check_f32("swiglu_backward", {&gate, &up, &dh});
    const int64_t n = gate.numel();
    if (n == 0)
        return;
    swiglu_backward_kernel<<<grid_for(n, kBlock), kBlock, 0, s.get()>>>(
        gate.ptr<float>(), up.ptr<float>(), dh.ptr<float>(), n);
    check_launch("swiglu_backward");
}

void relu2_backward(const Stream& s, Tensor& up, const Tensor& dh) {
    check_f32("relu2_backward", {&up, &dh});
    const int64_t n = up.numel();
    if (n == 0)
        return;
    relu2_backward_kernel<<<grid_for(n, kBlock), kBlock, 0, s.get()>>>(
        up.ptr<float>(), dh.ptr<float>(), n);
    check_launch("relu2_backward");
}

void sigmoid_gate_backward(
    const Stream& s, Tensor& du, const Tensor& o, const Tensor& g, Tensor& dz) {
    check_f32("sigmoid_gate_backward", {&du, &o, &g, &dz});
    const int64_t n = du.numel();
    if (n == 0)
        return;
    sigmoid_gate_backward_kernel<<<grid_for(n, kBlock), kBlock, 0, s.get()>>>(
        du.ptr<float>(), o.ptr<float>(), g.ptr<float>(), dz.ptr<float>(), n);
    check_launch("sigmoid_gate_backward");
}

void adamw(
    const Stream& s, Tensor& p, const Tensor& g, Tensor& m, Tensor& v, const ops::AdamWStep& step) {
    check_f32("adamw", {&p, &g, &m, &v});
    const int64_t n = p.numel();
    if (n == 0)
        return;
    adamw_kernel<<<grid_for(n, kBlock), kBlock, 0, s.get()>>>(
        p.ptr<float>(), g.ptr<float>(), m.ptr<float>(), v.ptr<float>(), step, n);
    check_launch("adamw");
}

}  // namespace hymoe::backend::cuda
