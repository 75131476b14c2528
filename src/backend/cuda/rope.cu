// RoPE on the device (hymoe/backend/cuda_ops.h): one thread per (token, pair, head). The angle
// pos·θ_i and its cos/sin are taken in double and rounded to float, times mscale, exactly as
// ops::rope does, so fp32 results match it to an ulp or so. θ travels in the kernel parameters.
#include "hymoe/backend/cuda_ops.h"
#include "kernels.h"

namespace hymoe::backend::cuda {

namespace {

struct RopeArgs {
    float theta[kMaxRopePairs];  // [half]
    int half;
    float mscale;
    int64_t n_tok, n_head, token_stride, head_stride;
    bool interleaved;
};

template <class T>
__global__ void rope_kernel(T* x, const int64_t* pos, const RopeArgs a) {
    const int64_t total = a.n_tok * a.half * a.n_head;
    for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < total;
         j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t h = j % a.n_head, i = (j / a.n_head) % a.half, t = j / (a.n_head * a.half);
        const double angle = static_cast<double>(pos[t]) * static_cast<double>(a.theta[i]);
        const float c = static_cast<float>(cos(angle)) * a.mscale;
        const float s = static_cast<float>(sin(angle)) * a.mscale;
        const int64_t v = t * a.token_stride + h * a.head_stride;
        const int64_t ia = a.interleaved ? v + 2 * i : v + i;
        const int64_t ib = a.interleaved ? v + 2 * i + 1 : v + i + a.half;
        const float x0 = load(x, ia), x1 = load(x, ib);
        store(x, ia, x0 * c - x1 * s);
        store(x, ib, x0 * s + x1 * c);
    }
}

}  // namespace

void rope(const Stream& s,
          DType dtype,
          void* x,
          int64_t n_tok,
          int64_t n_head,
          int64_t token_stride,
          int64_t head_stride,
          const int64_t* pos,
          const ops::RopeFreqs& freqs,
          bool interleaved) {
    HYMOE_CHECK(dtype == DType::f32 || dtype == DType::bf16, "rope: dtype ", to_string(dtype));
    const int half = static_cast<int>(freqs.theta.size());
    HYMOE_CHECK(half <= kMaxRopePairs, "rope: ", half, " pairs > ", kMaxRopePairs);
    const int64_t total = n_tok * n_head * half;
    if (total == 0)
        return;
    RopeArgs a{};
    for (int i = 0; i < half; ++i)
        a.theta[i] = freqs.theta[static_cast<size_t>(i)];
    a.half = half;
    a.mscale = freqs.mscale;
    a.n_tok = n_tok;
    a.n_head = n_head;
    a.token_stride = token_stride;
    a.head_stride = head_stride;
    a.interleaved = interleaved;
    dispatch(dtype, [&](auto tag) {
        using T = decltype(tag);
        rope_kernel<T><<<grid_for(total, kBlock), kBlock, 0, s.get()>>>(static_cast<T*>(x), pos, a);
    });
    check_launch("rope");
}

}  // namespace hymoe::backend::cuda
