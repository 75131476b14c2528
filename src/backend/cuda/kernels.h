// Shared pieces of the CUDA kernels (src/backend/cuda/*.cu only): element load/store in fp32
// for the two storage types (float, bf16), block-wide reductions, the dtype dispatch and the
// launch check. Every kernel computes in fp32 whatever it stores.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "check.h"
#include "hymoe/backend/cuda_arena.h"
#include "hymoe/tensor/tensor.h"

namespace hymoe::backend::cuda {

using bf16 = __nv_bfloat16;

constexpr int kBlock = 256;  // threads of the one-block-per-row kernels (a multiple of 32)

__device__ inline float load(const float* p, int64_t i) {
    return p[i];
}
__device__ inline float load(const bf16* p, int64_t i) {
    return __bfloat162float(p[i]);
}
__device__ inline void store(float* p, int64_t i, float v) {
    p[i] = v;
}
__device__ inline void store(bf16* p, int64_t i, float v) {
    p[i] = __float2bfloat16_rn(v);  // round to nearest even, as float_to_bf16 on the host
}

struct Sum {
    static constexpr float identity = 0.0f;
    __device__ float operator()(float a, float b) const { return a + b; }
};
struct Max {
    static constexpr float identity = -__builtin_huge_valf();
    __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// The reduction of v over the block (blockDim.x a multiple of 32, at most 1024), returned to
// every thread. Every thread of the block must call it.
template <class Op>
__device__ float block_reduce(float v, Op op) {
    __shared__ float part[32];
    __shared__ float total;
    for (int o = 16; o > 0; o >>= 1)
        v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warp = blockDim.x >> 5;
    __syncthreads();  // an earlier call's readers are done with part and total
    if (lane == 0)
        part[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < n_warp ? part[lane] : Op::identity;
        for (int o = 16; o > 0; o >>= 1)
            v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
        if (lane == 0)
            total = v;
    }
    __syncthreads();
    return total;
}

// Rows of a tensor whose last dimension is the row.
inline int64_t rows_of(const Tensor& t) {
    return t.dim(-1) == 0 ? 0 : t.numel() / t.dim(-1);
}

// A device tensor of f32 or bf16, of `dtype` when given.
inline void check_float(const Tensor& t, const char* op, DType dtype) {
    HYMOE_CHECK(t.device == Device::cuda && (t.dtype == DType::f32 || t.dtype == DType::bf16) &&
                    t.dtype == dtype,
                op,
                ": expected a ",
                to_string(dtype),
                " device tensor, got ",
                to_string(t.dtype),
                " on ",
                to_string(t.device));
}

// f(float{}) or f(bf16{}) by dtype: the caller's generic lambda instantiates the kernel.
template <class F>
void dispatch(DType t, F&& f) {
    if (t == DType::bf16)
        f(bf16{});
    else
        f(float{});
}

inline void check_launch(const char* op) {
    HYMOE_CUDA_CHECK(cudaGetLastError(), "launch of ", op);
}

// Blocks for a grid-stride loop over n elements: one per `block` elements, at most 2^20.
inline unsigned grid_for(int64_t n, int block) {
    const int64_t g = (n + block - 1) / block;
    return static_cast<unsigned>(g < 1 ? 1 : g > (int64_t{1} << 20) ? int64_t{1} << 20 : g);
}

}  // namespace hymoe::backend::cuda
