// RMSNorm, LayerNorm and l2norm over rows (hymoe/backend/cuda_ops.h): one block of kBlock
// threads per row, sums in fp32 by block_reduce (the CPU sums in double: parity to ~1e-6).
#include "hymoe/backend/cuda_ops.h"
#include "kernels.h"

namespace hymoe::backend::cuda {

namespace {

// y = w ⊙ (x · (mean(x²) + eps)^{-1/2})
template <class T>
__global__ void rms_norm_kernel(const T* x, const T* w, float eps, int64_t dim, T* y) {
    const int64_t base = static_cast<int64_t>(blockIdx.x) * dim;
    float ss = 0.0f;
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
        const float v = load(x, base + i);
        ss += v * v;
    }
    ss = block_reduce(ss, Sum{});
    const float scale = 1.0f / sqrtf(ss / static_cast<float>(dim) + eps);
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x)
        store(y, base + i, load(w, i) * (load(x, base + i) * scale));
}

// y = (x − mean) · (var + eps)^{-1/2} ⊙ w + b, var the biased variance (two passes)
template <class T>
__global__ void layer_norm_kernel(
    const T* x, const T* w, const T* b, float eps, int64_t dim, T* y) {
    const int64_t base = static_cast<int64_t>(blockIdx.x) * dim;
    float sum = 0.0f;
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x)
        sum += load(x, base + i);
    const float mean = block_reduce(sum, Sum{}) / static_cast<float>(dim);
    float var = 0.0f;
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
        const float d = load(x, base + i) - mean;
        var += d * d;
    }
    var = block_reduce(var, Sum{}) / static_cast<float>(dim);
    const float inv = 1.0f / sqrtf(var + eps);
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x)
        store(y, base + i, (load(x, base + i) - mean) * inv * load(w, i) + load(b, i));
}

// x ← x · (Σx² + eps)^{-1/2}
template <class T>
__global__ void l2_norm_kernel(T* x, float eps, int64_t dim) {
    const int64_t base = static_cast<int64_t>(blockIdx.x) * dim;
    float ss = 0.0f;
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
        const float v = load(x, base + i);
        ss += v * v;
    }
    const float inv = 1.0f / sqrtf(block_reduce(ss, Sum{}) + eps);
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x)
        store(x, base + i, load(x, base + i) * inv);
}

unsigned row_grid(int64_t rows, const char* op) {
    HYMOE_CHECK(rows <= INT32_MAX, op, ": ", rows, " rows");
    return static_cast<unsigned>(rows);
}

}  // namespace

void rms_norm(const Stream& s, const Tensor& x, const Tensor& w, float eps, Tensor& y) {
    check_float(x, "rms_norm", x.dtype);
    check_float(w, "rms_norm", x.dtype);
    check_float(y, "rms_norm", x.dtype);
    const int64_t dim = x.dim(-1), rows = rows_of(x);
    HYMOE_CHECK(w.numel() == dim && y.numel() == x.numel(),
                "rms_norm: x ",
                shape_string(x.shape),
                " w ",
                shape_string(w.shape),
                " y ",
                shape_string(y.shape));
    if (rows == 0)
        return;
    dispatch(x.dtype, [&](auto tag) {
        using T = decltype(tag);
        rms_norm_kernel<T><<<row_grid(rows, "rms_norm"), kBlock, 0, s.get()>>>(
            x.ptr<T>(), w.ptr<T>(), eps, dim, y.ptr<T>());
    });
    check_launch("rms_norm");
}

void layer_norm(
    const Stream& s, const Tensor& x, const Tensor& w, const Tensor& b, float eps, Tensor& y) {
    check_float(x, "layer_norm", x.dtype);
    check_float(w, "layer_norm", x.dtype);
    check_float(b, "layer_norm", x.dtype);
    check_float(y, "layer_norm", x.dtype);
    const int64_t dim = x.dim(-1), rows = rows_of(x);
    HYMOE_CHECK(w.numel() == dim && b.numel() == dim && y.numel() == x.numel(),
                "layer_norm: x ",
                shape_string(x.shape),
                " w ",
                shape_string(w.shape),
                " b ",
                shape_string(b.shape));
    if (rows == 0)
        return;
    dispatch(x.dtype, [&](auto tag) {
        using T = decltype(tag);
        layer_norm_kernel<T><<<row_grid(rows, "layer_norm"), kBlock, 0, s.get()>>>(
            x.ptr<T>(), w.ptr<T>(), b.ptr<T>(), eps, dim, y.ptr<T>());
    });
    check_launch("layer_norm");
}

void l2_norm_rows(const Stream& s, Tensor& x, float eps) {
    check_float(x, "l2_norm_rows", x.dtype);
    const int64_t rows = rows_of(x);
    if (rows == 0)
        return;
    dispatch(x.dtype, [&](auto tag) {
        using T = decltype(tag);
        l2_norm_kernel<T>
            <<<row_grid(rows, "l2_norm_rows"), kBlock, 0, s.get()>>>(x.ptr<T>(), eps, x.dim(-1));
    });
    check_launch("l2_norm_rows");
}

}  // namespace hymoe::backend::cuda
