// Top-k per row (hymoe/backend/cuda_ops.h), ops::top_k's order exactly: larger value first, ties
// to the smaller index. One block per row makes k passes; pass p finds the best element that
// comes after pass p−1's pick in that total order, so nothing is marked and the input stays
// const. Rows are assumed free of NaN (as the CPU comparator needs them).
#include <cmath>

#include "hymoe/backend/cuda_ops.h"
#include "kernels.h"

namespace hymoe::backend::cuda {

namespace {

struct Pick {
    float v;
    int64_t i;
};

// a precedes b in the top-k order
__device__ inline bool before(Pick a, Pick b) {
    return a.v > b.v || (a.v == b.v && a.i < b.i);
}

__global__ void top_k_kernel(const float* x, int64_t n, int64_t k, int64_t* idx) {
    __shared__ Pick part[kBlock];
    __shared__ Pick last;
    const float* row = x + static_cast<int64_t>(blockIdx.x) * n;
    const Pick none{-INFINITY, INT64_MAX};
    for (int64_t p = 0; p < k; ++p) {
        Pick best = none;
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
            const Pick c{row[i], i};
            if ((p == 0 || before(last, c)) && before(c, best))
                best = c;
        }
        part[threadIdx.x] = best;
        __syncthreads();
        for (int half = kBlock / 2; half > 0; half >>= 1) {
            if (threadIdx.x < half && before(part[threadIdx.x + half], part[threadIdx.x]))
                part[threadIdx.x] = part[threadIdx.x + half];
            __syncthreads();
        }
        if (threadIdx.x == 0) {
            last = part[0];
            idx[static_cast<int64_t>(blockIdx.x) * k + p] = part[0].i;
        }
        __syncthreads();
    }
}

}  // namespace

void top_k_rows(const Stream& s, const Tensor& x, int64_t k, Tensor& idx) {
    HYMOE_CHECK(x.device == Device::cuda && x.dtype == DType::f32 && idx.device == Device::cuda &&
                    idx.dtype == DType::i64,
                "top_k_rows: expected f32 scores and int64 indices on the device");
    const int64_t n = x.dim(-1), rows = rows_of(x);
    HYMOE_CHECK(k >= 0 && k <= n && idx.numel() == rows * k && rows <= INT32_MAX,
                "top_k_rows: k = ",
                k,
                " of x ",
                shape_string(x.shape),
                " into ",
                shape_string(idx.shape));
    if (rows == 0 || k == 0)
        return;
    top_k_kernel<<<static_cast<unsigned>(rows), kBlock, 0, s.get()>>>(
        x.ptr<float>(), n, k, idx.ptr<int64_t>());
    check_launch("top_k_rows");
}

}  // namespace hymoe::backend::cuda
