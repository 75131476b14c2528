// Causal depthwise conv with a tail (hymoe/backend/cuda_ops.h), as ops::causal_conv: one thread
// per output (t, c) sums w[c, i] · u_{t−W+1+i}[c] over i in the CPU's order, inputs before 0
// coming from the tail; then a second launch (stream-ordered after every read of the old tail)
// replaces the tail by the last W−1 rows of [tail; u], one thread per channel, rows ascending so
// that the in-place shift reads each old row before it is overwritten.
#include "hymoe/backend/cuda_ops.h"
#include "kernels.h"

namespace hymoe::backend::cuda {

namespace {

// Row j of the extended sequence [tail; u], channel c.
template <class T>
__device__ inline float extended(
    const T* tail, const T* u, int64_t j, int64_t c, int64_t C, int64_t W) {
    return j < W - 1 ? load(tail, j * C + c) : load(u, (j - (W - 1)) * C + c);
}

template <class T>
__global__ void conv_kernel(
    const T* u, const T* w, const T* tail, T* y, int64_t T_len, int64_t C, int64_t W) {
    for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < T_len * C;
         j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t t = j / C, c = j % C;
        float acc = 0.0f;
        for (int64_t i = 0; i < W; ++i)
            acc += load(w, c * W + i) * extended(tail, u, t + i, c, C, W);
        store(y, j, acc);
    }
}

template <class T>
__global__ void tail_kernel(const T* u, T* tail, int64_t T_len, int64_t C, int64_t W) {
    const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    if (c >= C)
        return;
    for (int64_t j = 0; j < W - 1; ++j)
        store(tail, j * C + c, extended(tail, u, T_len + j, c, C, W));
}

}  // namespace

void causal_conv(const Stream& s, const Tensor& u, const Tensor& w, Tensor& tail, Tensor& y) {
    check_float(u, "causal_conv", u.dtype);
    check_float(w, "causal_conv", u.dtype);
    check_float(tail, "causal_conv", u.dtype);
    check_float(y, "causal_conv", u.dtype);
    const int64_t T_len = u.dim(0), C = u.dim(1), W = w.dim(1);
    HYMOE_CHECK(u.shape.size() == 2 && w.dim(0) == C && tail.numel() == (W - 1) * C &&
                    y.numel() == T_len * C && y.data != u.data,
                "causal_conv: u ",
                shape_string(u.shape),
                " w ",
                shape_string(w.shape),
                " tail ",
                shape_string(tail.shape));
    if (T_len == 0 || C == 0)
        return;
    dispatch(u.dtype, [&](auto tag) {
        using T = decltype(tag);
        conv_kernel<T><<<grid_for(T_len * C, kBlock), kBlock, 0, s.get()>>>(
            u.ptr<T>(), w.ptr<T>(), tail.ptr<T>(), y.ptr<T>(), T_len, C, W);
        check_launch("causal_conv");
        if (W > 1)
            tail_kernel<T><<<grid_for(C, kBlock), kBlock, 0, s.get()>>>(
                u.ptr<T>(), tail.ptr<T>(), T_len, C, W);
    });
    check_launch("causal_conv tail");
}

}  // namespace hymoe::backend::cuda
