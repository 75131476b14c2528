// SiLU and sigmoid in place, SwiGLU, the residual add, the gate product and the scale
// (hymoe/backend/cuda_ops.h): grid-stride
// loops, with expf (not the fast __expf) so that σ(x) = 1 / (1 + e^{−x}) matches ops::sigmoid to ~1
// ulp.
#include "hymoe/backend/cuda_ops.h"
#include "kernels.h"

namespace hymoe::backend::cuda {

namespace {

__device__ inline float sigmoid_f(float x) {
    return 1.0f / (1.0f + expf(-x));
}

enum class Act { silu, sigmoid };

template <class T, Act act>
__global__ void activate_kernel(T* x, int64_t n) {
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const float v = load(x, i);
        store(x, i, act == Act::silu ? v * sigmoid_f(v) : sigmoid_f(v));
    }
}

template <class T>
__global__ void swiglu_kernel(const T* gate, const T* up, T* y, int64_t n) {
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const float g = load(gate, i);
        store(y, i, g * sigmoid_f(g) * load(up, i));
    }
}

enum class Bin { add, mul };

template <class T, Bin op>
__global__ void binary_kernel(T* x, const T* y, int64_t n) {
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x)
        store(x, i, op == Bin::add ? load(x, i) + load(y, i) : load(x, i) * load(y, i));
}

template <class T>
__global__ void scale_kernel(T* x, float c, int64_t n) {
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x)
        store(x, i, c * load(x, i));
}

template <Bin op>
void binary(const Stream& s, Tensor& x, const Tensor& y, const char* name) {
    check_float(x, name, x.dtype);
    check_float(y, name, x.dtype);
    HYMOE_CHECK(
        x.numel() == y.numel(), name, ": ", shape_string(x.shape), " and ", shape_string(y.shape));
    const int64_t n = x.numel();
    if (n == 0)
        return;
    dispatch(x.dtype, [&](auto tag) {
        using T = decltype(tag);
        binary_kernel<T, op>
            <<<grid_for(n, kBlock), kBlock, 0, s.get()>>>(x.ptr<T>(), y.ptr<T>(), n);
    });
    check_launch(name);
}

template <Act act>
void activate(const Stream& s, Tensor& x, const char* op) {
    check_float(x, op, x.dtype);
    const int64_t n = x.numel();
    if (n == 0)
        return;
    dispatch(x.dtype, [&](auto tag) {
        using T = decltype(tag);
        activate_kernel<T, act><<<grid_for(n, kBlock), kBlock, 0, s.get()>>>(x.ptr<T>(), n);
    });
    check_launch(op);
}

}  // namespace

void silu_inplace(const Stream& s, Tensor& x) {
    activate<Act::silu>(s, x, "silu_inplace");
}

void sigmoid_inplace(const Stream& s, Tensor& x) {
    activate<Act::sigmoid>(s, x, "sigmoid_inplace");
}

void swiglu(const Stream& s, const Tensor& gate, const Tensor& up, Tensor& y) {
    check_float(gate, "swiglu", gate.dtype);
    check_float(up, "swiglu", gate.dtype);
    check_float(y, "swiglu", gate.dtype);
    HYMOE_CHECK(gate.numel() == up.numel() && y.numel() == up.numel(),
                "swiglu: gate ",
                shape_string(gate.shape),
                " up ",
                shape_string(up.shape));
    const int64_t n = y.numel();
    if (n == 0)
        return;
    dispatch(gate.dtype, [&](auto tag) {
        using T = decltype(tag);
        swiglu_kernel<T><<<grid_for(n, kBlock), kBlock, 0, s.get()>>>(
            gate.ptr<T>(), up.ptr<T>(), y.ptr<T>(), n);
    });
    check_launch("swiglu");
}

void add_inplace(const Stream& s, Tensor& x, const Tensor& y) {
    binary<Bin::add>(s, x, y, "add_inplace");
}

void mul_inplace(const Stream& s, Tensor& x, const Tensor& y) {
    binary<Bin::mul>(s, x, y, "mul_inplace");
}

void scale_inplace(const Stream& s, Tensor& x, float c) {
    check_float(x, "scale_inplace", x.dtype);
    const int64_t n = x.numel();
    if (n == 0)
        return;
    dispatch(x.dtype, [&](auto tag) {
        using T = decltype(tag);
        scale_kernel<T><<<grid_for(n, kBlock), kBlock, 0, s.get()>>>(x.ptr<T>(), c, n);
    });
    check_launch("scale_inplace");
}

}  // namespace hymoe::backend::cuda
