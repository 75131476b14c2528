// The DSA lightning indexer's scores on the device (hymoe/backend/cuda_ops.h): a block takes one
// query and kBlock keys, holds the query's H_I·d_I values in shared memory, and each thread sums
// w_j · ReLU(q_j · k_s) over the heads j in order, as ops::indexer_scores does. A direct kernel,
// not a GEMM: the decode step scores one query against the whole context.
#include "hymoe/backend/cuda_ops.h"
#include "kernels.h"

namespace hymoe::backend::cuda {

namespace {

constexpr int64_t kMaxQuery = 12288;  // floats of one query in shared memory (48 KiB)

__global__ void indexer_kernel(const float* q,
                               const float* w,
                               const float* k,
                               int64_t n_k,
                               int64_t n_head,
                               int64_t d,
                               float* scores) {
    __shared__ float q_t[kMaxQuery];
    const int64_t t = blockIdx.y;
    for (int64_t i = threadIdx.x; i < n_head * d; i += blockDim.x)
        q_t[i] = q[t * n_head * d + i];
    __syncthreads();
    const int64_t s = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    if (s >= n_k)
        return;
    const float* k_s = k + s * d;
    float acc = 0.0f;
    for (int64_t j = 0; j < n_head; ++j) {
        float dot = 0.0f;
        for (int64_t x = 0; x < d; ++x)
            dot += q_t[j * d + x] * k_s[x];
        acc += w[t * n_head + j] * fmaxf(dot, 0.0f);
    }
    scores[t * n_k + s] = acc;
}

}  // namespace

void indexer_scores(
    const Stream& s, const Tensor& q, const Tensor& w, const Tensor& k, Tensor& scores) {
    check_float(q, "indexer_scores", DType::f32);
    check_float(w, "indexer_scores", DType::f32);
    check_float(k, "indexer_scores", DType::f32);
    check_float(scores, "indexer_scores", DType::f32);
    const int64_t n_q = q.dim(0), n_head = w.dim(1), d = k.dim(1), n_k = k.dim(0);
    HYMOE_CHECK(w.dim(0) == n_q && q.dim(1) == n_head * d && scores.dim(0) == n_q &&
                    scores.dim(1) == n_k && n_head * d <= kMaxQuery && n_q <= 65535,
                "indexer_scores: q ",
                shape_string(q.shape),
                " w ",
                shape_string(w.shape),
                " k ",
                shape_string(k.shape),
                " scores ",
                shape_string(scores.shape));
    if (n_q == 0 || n_k == 0)
        return;
    const dim3 grid(grid_for(n_k, kBlock), static_cast<unsigned>(n_q));
    indexer_kernel<<<grid, kBlock, 0, s.get()>>>(
        q.ptr<float>(), w.ptr<float>(), k.ptr<float>(), n_k, n_head, d, scores.ptr<float>());
    check_launch("indexer_scores");
}

}  // namespace hymoe::backend::cuda
