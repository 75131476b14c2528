// Softmax over rows with −inf masking (hymoe/backend/cuda_ops.h): one block per row, the row's
// maximum, then e^{x − max} and their sum, then a scale by 1 / sum; a row whose maximum is −inf
// (every entry masked) becomes zeros, as ops::softmax_rows. e^{−inf} = 0 masks the rest.
#include <cmath>

#include "hymoe/backend/cuda_ops.h"
#include "kernels.h"

namespace hymoe::backend::cuda {

namespace {

template <class T>
__global__ void softmax_kernel(T* x, int64_t n) {
    const int64_t base = static_cast<int64_t>(blockIdx.x) * n;
    float mx = -INFINITY;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
        mx = fmaxf(mx, load(x, base + i));
    mx = block_reduce(mx, Max{});
    if (mx == -INFINITY) {
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
            store(x, base + i, 0.0f);
        return;
    }
    float sum = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
        sum += expf(load(x, base + i) - mx);
    const float inv = 1.0f / block_reduce(sum, Sum{});
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
        store(x, base + i, expf(load(x, base + i) - mx) * inv);
}

}  // namespace

void softmax_rows(const Stream& s, Tensor& x) {
    check_float(x, "softmax_rows", x.dtype);
    const int64_t rows = rows_of(x);
    if (rows == 0)
        return;
    HYMOE_CHECK(rows <= INT32_MAX, "softmax_rows: ", rows, " rows");
    dispatch(x.dtype, [&](auto tag) {
        using T = decltype(tag);
        softmax_kernel<T>
            <<<static_cast<unsigned>(rows), kBlock, 0, s.get()>>>(x.ptr<T>(), x.dim(-1));
    });
    check_launch("softmax_rows");
}

}  // namespace hymoe::backend::cuda
