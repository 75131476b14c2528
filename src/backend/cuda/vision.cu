// The vision tower's kernels (hymoe/backend/cuda_vision.h): grid-stride loops, one thread per
// element (bias and GELU), per (token, head, pair) (2-D RoPE) or per output element (gathered
// means). The GELUs use tanhf / erff (not fast intrinsics), as the CPU's std::tanh / std::erf.
#include <cmath>

#include "hymoe/backend/cuda_vision.h"
#include "kernels.h"

namespace hymoe::backend::cuda {

namespace {

__global__ void bias_act_kernel(float* x, const float* b, int64_t n, int64_t w, BiasAct act) {
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n * w;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const float v = x[i] + b[i % w];
        if (act == BiasAct::gelu_tanh) {
            const float k = 0.7978845608028654f;  // sqrt(2/π)
            x[i] = 0.5f * v * (1.0f + tanhf(k * (v + 0.044715f * v * v * v)));
        } else if (act == BiasAct::gelu_erf) {
            x[i] = 0.5f * v * (1.0f + erff(v * 0.7071067811865476f));
        } else {
            x[i] = v;
        }
    }
}

struct Rope2dArgs {
    float theta[kMaxRope2dFreqs];  // [head_dim / 4]
    int64_t n, n_head, head_dim, token_stride;
};

// Pair j of a head (elements 2j, 2j + 1) turns by column·θ_{j/2} (j even) or row·θ_{j/2} (odd).
__global__ void rope_2d_kernel(float* x, const int32_t* pos, const Rope2dArgs a) {
    const int64_t pairs = a.head_dim / 2, total = a.n * a.n_head * pairs;
    for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
         e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t j = e % pairs, h = (e / pairs) % a.n_head, t = e / (pairs * a.n_head);
        const float along = static_cast<float>(pos[2 * t + (j % 2 == 0 ? 1 : 0)]);
        const float angle = along * a.theta[j / 2];
        const float c = static_cast<float>(cos(static_cast<double>(angle)));
        const float s = static_cast<float>(sin(static_cast<double>(angle)));
        float* p = x + t * a.token_stride + h * a.head_dim + 2 * j;
        const float u = p[0], v = p[1];
        p[0] = u * c - v * s;
        p[1] = u * s + v * c;
    }
}

__global__ void gather_mean_kernel(
    const float* x, const int64_t* idx, int64_t r, int64_t g, int64_t w, float* out) {
    const float inv = 1.0f / static_cast<float>(g);
    for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < r * w;
         e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t i = e / w, k = e % w;
        float acc = 0.0f;
        for (int64_t j = 0; j < g; ++j)
            acc += x[idx[i * g + j] * w + k];
        out[e] = acc * inv;
    }
}

}  // namespace

void bias_act(const Stream& s, Tensor& x, const Tensor& b, BiasAct act) {
    check_float(x, "bias_act", DType::f32);
    check_float(b, "bias_act", DType::f32);
    const int64_t w = x.dim(-1), n = rows_of(x);
    HYMOE_CHECK(
        b.numel() == w, "bias_act: x ", shape_string(x.shape), " bias ", shape_string(b.shape));
    if (n * w == 0)
        return;
    bias_act_kernel<<<grid_for(n * w, kBlock), kBlock, 0, s.get()>>>(
        x.ptr<float>(), b.ptr<float>(), n, w, act);
    check_launch("bias_act");
}

void rope_2d(const Stream& s,
             float* x,
             int64_t n,
             int64_t n_head,
             int64_t head_dim,
             int64_t token_stride,
             const int32_t* pos) {
    HYMOE_CHECK(head_dim % 4 == 0 && head_dim / 4 <= kMaxRope2dFreqs,
                "rope_2d: head_dim ",
                head_dim,
                " (a multiple of 4, at most ",
                4 * kMaxRope2dFreqs,
                ")");
    const int64_t total = n * n_head * (head_dim / 2);
    if (total == 0)
        return;
    Rope2dArgs a{};
    for (int64_t i = 0; i < head_dim / 4; ++i)  // as ops::rope_2d: in double, rounded
        a.theta[i] = static_cast<float>(
            std::pow(10000.0, -4.0 * static_cast<double>(i) / static_cast<double>(head_dim)));
    a.n = n;
    a.n_head = n_head;
    a.head_dim = head_dim;
    a.token_stride = token_stride;
    rope_2d_kernel<<<grid_for(total, kBlock), kBlock, 0, s.get()>>>(x, pos, a);
    check_launch("rope_2d");
}

void gather_mean_rows(const Stream& s, const Tensor& x, const Tensor& idx, Tensor& out) {
    check_float(x, "gather_mean_rows", DType::f32);
    check_float(out, "gather_mean_rows", DType::f32);
    HYMOE_CHECK(idx.device == Device::cuda && idx.dtype == DType::i64 && idx.shape.size() == 2 &&
                    out.dim(-1) == x.dim(-1) && rows_of(out) == idx.dim(0) && idx.dim(1) >= 1,
                "gather_mean_rows: x ",
                shape_string(x.shape),
                " idx ",
                shape_string(idx.shape),
                " out ",
                shape_string(out.shape));
    const int64_t r = idx.dim(0), w = x.dim(-1);
    if (r * w == 0)
        return;
    gather_mean_kernel<<<grid_for(r * w, kBlock), kBlock, 0, s.get()>>>(
        x.ptr<float>(), idx.ptr<int64_t>(), r, idx.dim(1), w, out.ptr<float>());
    check_launch("gather_mean_rows");
}

}  // namespace hymoe::backend::cuda
