// Greedy decoding and logprobs on the device (hymoe/backend/cuda_ops.h), with the host sampler's
// rules (runtime/sampler.h): the argmax takes the smallest id among equal maxima, and
// log_softmax(x)[t] = x[t] − max − log Σ e^{x − max} with the exponentials summed in double.
// One block per row: a (value, id) reduction, then a double-precision sum. top_logit_rows gives the
// host sampler a row's top tokens' logits and the same double sum (model::TopLogits).
#include <cmath>

#include "hymoe/backend/cuda_ops.h"
#include "kernels.h"

namespace hymoe::backend::cuda {

namespace {

// Σ_i e^{x_i − mx} over the row x [V], in double, in every thread of the block (part: kBlock
// doubles of shared memory).
__device__ double exp_sum(const float* x, int64_t V, double mx, double* part) {
    double sum = 0;
    for (int64_t i = threadIdx.x; i < V; i += blockDim.x)
        sum += exp(static_cast<double>(x[i]) - mx);
    part[threadIdx.x] = sum;
    __syncthreads();
    for (int half = kBlock / 2; half > 0; half >>= 1) {
        if (threadIdx.x < half)
            part[threadIdx.x] += part[threadIdx.x + half];
        __syncthreads();
    }
    return part[0];
}

// choose: tokens[row] ← the argmax; else tokens[row] is read.
__global__ void logprob_kernel(
    const float* logits, int64_t V, bool choose, int64_t* tokens, float* logprobs) {
    __shared__ float best_v[kBlock];
    __shared__ int64_t best_i[kBlock];
    __shared__ double part[kBlock];
    const float* x = logits + static_cast<int64_t>(blockIdx.x) * V;
    float bv = -INFINITY;
    int64_t bi = INT64_MAX;
    for (int64_t i = threadIdx.x; i < V; i += blockDim.x)
        if (x[i] > bv || (x[i] == bv && i < bi)) {
            bv = x[i];
            bi = i;
        }
    best_v[threadIdx.x] = bv;
    best_i[threadIdx.x] = bi;
    __syncthreads();
    for (int half = kBlock / 2; half > 0; half >>= 1) {
        if (threadIdx.x < half) {
            const float v = best_v[threadIdx.x + half];
            const int64_t i = best_i[threadIdx.x + half];
            if (v > best_v[threadIdx.x] || (v == best_v[threadIdx.x] && i < best_i[threadIdx.x])) {
                best_v[threadIdx.x] = v;
                best_i[threadIdx.x] = i;
            }
        }
        __syncthreads();
    }
    const double mx = static_cast<double>(best_v[0]);
    const double sum = exp_sum(x, V, mx, part);
    if (threadIdx.x == 0) {
        if (choose)
            tokens[blockIdx.x] = best_i[0];
        const int64_t t = tokens[blockIdx.x];
        logprobs[blockIdx.x] = static_cast<float>(static_cast<double>(x[t]) - mx - log(sum));
    }
}

// Row blockIdx.x: values ← the logits at idx (idx[0] the row's maximum), log_sum ← log Σ e^{x −
// max}.
__global__ void top_logit_kernel(
    const float* logits, int64_t V, const int64_t* idx, int64_t n, float* values, double* log_sum) {
    __shared__ double part[kBlock];
    const float* x = logits + static_cast<int64_t>(blockIdx.x) * V;
    const int64_t* row_idx = idx + static_cast<int64_t>(blockIdx.x) * n;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
        values[static_cast<int64_t>(blockIdx.x) * n + i] = x[row_idx[i]];
    const double mx = static_cast<double>(x[row_idx[0]]);
    const double sum = exp_sum(x, V, mx, part);
    if (threadIdx.x == 0)
        log_sum[blockIdx.x] = log(sum);
}

void launch(const Stream& s,
            const Tensor& logits,
            bool choose,
            const Tensor& tokens,
            Tensor& logprobs,
            const char* op) {
    const int64_t rows = logits.dim(0), V = logits.dim(-1);
    HYMOE_CHECK(logits.device == Device::cuda && logits.dtype == DType::f32 &&
                    logits.shape.size() == 2 && tokens.device == Device::cuda &&
                    tokens.dtype == DType::i64 && tokens.numel() == rows &&
                    logprobs.device == Device::cuda && logprobs.dtype == DType::f32 &&
                    logprobs.numel() == rows && V > 0 && rows <= INT32_MAX,
                op,
                ": logits ",
                to_string(logits.dtype),
                shape_string(logits.shape),
                " tokens ",
                to_string(tokens.dtype),
                shape_string(tokens.shape),
                " logprobs ",
                to_string(logprobs.dtype),
                shape_string(logprobs.shape));
    if (rows == 0)
        return;
    logprob_kernel<<<static_cast<unsigned>(rows), kBlock, 0, s.get()>>>(
        logits.ptr<float>(), V, choose, tokens.ptr<int64_t>(), logprobs.ptr<float>());
    check_launch(op);
}

}  // namespace

void greedy_rows(const Stream& s, const Tensor& logits, Tensor& tokens, Tensor& logprobs) {
    launch(s, logits, true, tokens, logprobs, "greedy_rows");
}

void token_logprobs(const Stream& s, const Tensor& logits, const Tensor& tokens, Tensor& logprobs) {
    launch(s, logits, false, tokens, logprobs, "token_logprobs");
}

void top_logit_rows(
    const Stream& s, const Tensor& logits, const Tensor& idx, Tensor& values, double* log_sum) {
    const int64_t rows = logits.shape.size() == 2 ? logits.dim(0) : -1, V = logits.dim(-1);
    const int64_t n = idx.dim(-1);
    HYMOE_CHECK(logits.device == Device::cuda && logits.dtype == DType::f32 && rows >= 0 &&
                    idx.device == Device::cuda && idx.dtype == DType::i64 &&
                    (idx.shape == Shape{rows, n}) && n >= 1 && n <= V &&
                    values.device == Device::cuda && values.dtype == DType::f32 &&
                    values.shape == idx.shape && rows <= INT32_MAX,
                "top_logit_rows: logits ",
                to_string(logits.dtype),
                shape_string(logits.shape),
                " idx ",
                to_string(idx.dtype),
                shape_string(idx.shape),
                " values ",
                to_string(values.dtype),
                shape_string(values.shape));
    if (rows == 0)
        return;
    top_logit_kernel<<<static_cast<unsigned>(rows), kBlock, 0, s.get()>>>(
        logits.ptr<float>(), V, idx.ptr<int64_t>(), n, values.ptr<float>(), log_sum);
    check_launch("top_logit_rows");
}

}  // namespace hymoe::backend::cuda
