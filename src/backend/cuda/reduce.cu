// The whole-tensor reductions' kernels (hymoe/backend/cuda_reduce.h): one block of kBlock threads,
// each summing a strided share in double, then a tree over the block.
#include "hymoe/backend/cuda_reduce.h"
#include "kernels.h"

namespace hymoe::backend::cuda {

namespace {

__global__ void sum_of_squares_kernel(const float* x, int64_t n, double* out) {
    __shared__ double part[kBlock];
    double s = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
        s += static_cast<double>(x[i]) * static_cast<double>(x[i]);
    part[threadIdx.x] = s;
    __syncthreads();
    for (int o = kBlock / 2; o > 0; o >>= 1) {
        if (static_cast<int>(threadIdx.x) < o)
            part[threadIdx.x] += part[threadIdx.x + o];
        __syncthreads();
    }
    if (threadIdx.x == 0)
        *out = part[0];
}

}  // namespace

void sum_of_squares(const Stream& s, const Tensor& x, double* out) {
    check_float(x, "sum_of_squares", DType::f32);
    sum_of_squares_kernel<<<1, kBlock, 0, s.get()>>>(x.ptr<float>(), x.numel(), out);
    check_launch("sum_of_squares");
}

}  // namespace hymoe::backend::cuda
