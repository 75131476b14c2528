// ops::dropout_rows on the GPU (backend/cuda_dropout.h): one thread an element, each drawing its
// uniform from Philox4x32-10 as core/rng.cpp does (key = the seed's halves, counter = (c/4 lo,
// c/4 hi, stream, row), lane c mod 4, u = (draw >> 8)·2^-24), so the mask is the CPU's bit for bit.
#include "hymoe/backend/cuda_dropout.h"
#include "kernels.h"

namespace hymoe::backend::cuda {

namespace {

// The 4 draws of Philox4x32-10 block ctr under key (core/rng.cpp's rounds and key schedule).
__device__ uint4 philox_block(uint4 c, uint2 k) {
    for (int r = 0; r < 10; ++r) {
        if (r > 0) {
            k.x += 0x9E3779B9u;
            k.y += 0xBB67AE85u;
        }
        const unsigned long long p0 = 0xD2511F53ull * c.x, p1 = 0xCD9E8D57ull * c.z;
        c = make_uint4(static_cast<uint32_t>(p1 >> 32) ^ c.y ^ k.x,
                       static_cast<uint32_t>(p1),
                       static_cast<uint32_t>(p0 >> 32) ^ c.w ^ k.y,
                       static_cast<uint32_t>(p0));
    }
    return c;
}

__global__ void dropout_rows_kernel(const float* x,
                                    float* y,
                                    int64_t n,
                                    int64_t in,
                                    float keep,
                                    float kept,
                                    uint2 key,
                                    uint32_t stream) {
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n * in;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t row = i / in, c = i % in, block = c >> 2;
        const uint4 d = philox_block(make_uint4(static_cast<uint32_t>(block),
                                                static_cast<uint32_t>(block >> 32),
                                                stream,
                                                static_cast<uint32_t>(row)),
                                     key);
        const uint32_t lane = static_cast<uint32_t>(c & 3);
        const uint32_t u32 = lane == 0 ? d.x : lane == 1 ? d.y : lane == 2 ? d.z : d.w;
        const float u = static_cast<float>(u32 >> 8) * (1.0f / 16777216.0f);
        y[i] = x[i] * (u < keep ? kept : 0.0f);
    }
}

}  // namespace

void dropout_rows(const Stream& s, const Tensor& x, const ops::DropoutKey& key, Tensor& y) {
    const int64_t n = x.dim(0), in = x.dim(1);
    if (n * in == 0)
        return;
    const float keep = 1.0f - key.p;
    dropout_rows_kernel<<<grid_for(n * in, kBlock), kBlock, 0, s.get()>>>(
        x.ptr<float>(),
        y.ptr<float>(),
        n,
        in,
        keep,
        1.0f / keep,
        make_uint2(static_cast<uint32_t>(key.seed), static_cast<uint32_t>(key.seed >> 32)),
        key.stream);
    check_launch("dropout_rows");
}

}  // namespace hymoe::backend::cuda
