// Top-k per row (hymoe/backend/cuda_ops.h), ops::top_k's order exactly: larger value first, ties
// to the smaller index. One block per row, two ways:
//  - short rows (n ≤ kShortRow) or large k: k passes; pass p finds the best element that comes
//    after pass p−1's pick in that total order, so nothing is marked and the input stays const;
//  - long rows (the DSA indexer's scores over the context) with k ≤ kMaxSortK: a radix select
//    finds the k-th largest value T in four 8-bit passes over order-preserving integer keys, every
//    element above T and the first (smallest-index) elements equal to T are gathered into shared
//    memory, and a bitonic sort puts them in the top-k order.
// Rows are assumed free of NaN (as the CPU comparator needs them); −0 and +0 are equal, as on the
// CPU.
#include <algorithm>
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

// Row r's length: n, or with a causal cut (pos_first ≥ 0) its first pos_first + r + 1 entries.
__device__ inline int64_t row_length(int64_t n, int64_t pos_first) {
    return pos_first < 0 ? n : min(n, pos_first + static_cast<int64_t>(blockIdx.x) + 1);
}

__global__ void top_k_kernel(
    const float* x, int64_t n, int64_t pos_first, int64_t k, int64_t* idx) {
    __shared__ Pick part[kBlock];
    __shared__ Pick last;
    const float* row = x + static_cast<int64_t>(blockIdx.x) * n;
    const int64_t n_r = row_length(n, pos_first), k_r = min(k, n_r);
    const Pick none{-INFINITY, INT64_MAX};
    for (int64_t p = k_r + threadIdx.x; p < k; p += blockDim.x)
        idx[static_cast<int64_t>(blockIdx.x) * k + p] = -1;
    for (int64_t p = 0; p < k_r; ++p) {
        Pick best = none;
        for (int64_t i = threadIdx.x; i < n_r; i += blockDim.x) {
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

constexpr int64_t kShortRow = 1024;
constexpr int kMaxSortK = 4096;
constexpr int kRadixBlock = 512;

// Larger float -> larger key; −0 is keyed as +0.
__device__ inline uint32_t order_key(float v) {
    const uint32_t u = v == 0.0f ? 0u : __float_as_uint(v);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__global__ void top_k_radix_kernel(
    const float* x, int64_t n_stride, int64_t pos_first, int k_max, int64_t* idx) {
    __shared__ int hist[256];
    __shared__ uint32_t prefix, mask;
    __shared__ int remaining, n_cand, taken_eq;
    __shared__ int warp_count[kRadixBlock / 32];
    __shared__ float cand_v[kMaxSortK];
    __shared__ int cand_i[kMaxSortK];
    const float* row = x + static_cast<int64_t>(blockIdx.x) * n_stride;
    const int64_t n = row_length(n_stride, pos_first);
    const int k = static_cast<int>(min(static_cast<int64_t>(k_max), n));
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    if (tid == 0) {
        prefix = 0;
        mask = 0;
        remaining = k;  // how many of the elements matching prefix are still to be taken
    }
    // ---- radix select: T = the k-th largest key, remaining = how many equal to T are taken
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = tid; b < 256; b += blockDim.x)
            hist[b] = 0;
        __syncthreads();
        for (int64_t i = tid; i < n; i += blockDim.x) {
            const uint32_t key = order_key(row[i]);
            if ((key & mask) == prefix)
                atomicAdd(&hist[(key >> shift) & 0xFFu], 1);
        }
        __syncthreads();
        if (tid == 0) {
            int above = 0, b = 255;
            while (above + hist[b] < remaining)  // the bin holding the remaining-th largest
                above += hist[b--];
            remaining -= above;
            prefix |= static_cast<uint32_t>(b) << shift;
            mask |= 0xFFu << shift;
        }
        __syncthreads();
    }
    const uint32_t T = prefix;
    // ---- gather: every key above T (any order), then the first `remaining` equal to T
    if (tid == 0) {
        n_cand = 0;
        taken_eq = 0;
    }
    __syncthreads();
    for (int64_t i = tid; i < n; i += blockDim.x)
        if (order_key(row[i]) > T) {
            const int pos = atomicAdd(&n_cand, 1);
            cand_v[pos] = row[i];
            cand_i[pos] = static_cast<int>(i);
        }
    __syncthreads();
    const int need = remaining;
    for (int64_t base = 0; base < n && taken_eq < need; base += blockDim.x) {
        const int64_t i = base + tid;
        const bool eq = i < n && order_key(row[i]) == T;
        const unsigned ballot = __ballot_sync(0xffffffffu, eq);
        if (lane == 0)
            warp_count[warp] = __popc(ballot);
        __syncthreads();
        int before_me = taken_eq + __popc(ballot & ((1u << lane) - 1u));
        for (int w = 0; w < warp; ++w)
            before_me += warp_count[w];
        if (eq && before_me < need) {
            const int pos = atomicAdd(&n_cand, 1);
            cand_v[pos] = row[i];
            cand_i[pos] = static_cast<int>(i);
        }
        __syncthreads();
        if (tid == 0)
            for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w)
                taken_eq += warp_count[w];
        __syncthreads();
    }
    // ---- bitonic sort of the k candidates (padded to a power of two) into the top-k order
    int P = 1;
    while (P < k)
        P <<= 1;
    for (int i = k + tid; i < P; i += blockDim.x) {
        cand_v[i] = -INFINITY;
        cand_i[i] = INT32_MAX;
    }
    __syncthreads();
    for (int size = 2; size <= P; size <<= 1) {
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int i = tid; i < P; i += blockDim.x) {
                const int j = i ^ stride;
                if (j <= i)
                    continue;
                const Pick a{cand_v[i], cand_i[i]}, b{cand_v[j], cand_i[j]};
                const bool forward = (i & size) == 0;  // this run sorts best-first
                if (forward ? before(b, a) : before(a, b)) {
                    cand_v[i] = b.v;
                    cand_i[i] = static_cast<int>(b.i);
                    cand_v[j] = a.v;
                    cand_i[j] = static_cast<int>(a.i);
                }
            }
            __syncthreads();
        }
    }
    for (int i = tid; i < k_max; i += blockDim.x)
        idx[static_cast<int64_t>(blockIdx.x) * k_max + i] = i < k ? cand_i[i] : -1;
}

__global__ void fill_kernel(float* x, int64_t n, float v) {
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x)
        x[i] = v;
}

// mask [rows, n] entry (r, idx[r, j]) ← 0 for every kept (non-negative) idx
__global__ void keep_kernel(const int64_t* idx, int64_t rows, int64_t k, int64_t n, float* mask) {
    for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < rows * k;
         j += static_cast<int64_t>(gridDim.x) * blockDim.x)
        if (idx[j] >= 0)
            mask[j / k * n + idx[j]] = 0.0f;
}

}  // namespace

namespace {

void top_k_launch(
    const Stream& s, const Tensor& x, int64_t pos_first, int64_t k, Tensor& idx, const char* op) {
    HYMOE_CHECK(x.device == Device::cuda && x.dtype == DType::f32 && idx.device == Device::cuda &&
                    idx.dtype == DType::i64,
                op,
                ": expected f32 scores and int64 indices on the device");
    const int64_t n = x.dim(-1), rows = rows_of(x);
    HYMOE_CHECK(k >= 0 && k <= n && idx.numel() == rows * k && rows <= INT32_MAX &&
                    (pos_first < 0 || pos_first + rows <= n),
                op,
                ": k = ",
                k,
                " of x ",
                shape_string(x.shape),
                " into ",
                shape_string(idx.shape),
                " first position ",
                pos_first);
    if (rows == 0 || k == 0)
        return;
    if (n > kShortRow && k <= kMaxSortK) {
        HYMOE_CHECK(n <= INT32_MAX, op, ": rows of ", n);
        top_k_radix_kernel<<<static_cast<unsigned>(rows), kRadixBlock, 0, s.get()>>>(
            x.ptr<float>(), n, pos_first, static_cast<int>(k), idx.ptr<int64_t>());
    } else {
        top_k_kernel<<<static_cast<unsigned>(rows), kBlock, 0, s.get()>>>(
            x.ptr<float>(), n, pos_first, k, idx.ptr<int64_t>());
    }
    check_launch(op);
}

}  // namespace

void top_k_rows(const Stream& s, const Tensor& x, int64_t k, Tensor& idx) {
    top_k_launch(s, x, -1, k, idx, "top_k_rows");
}

void top_k_rows_causal(
    const Stream& s, const Tensor& x, int64_t pos_first, int64_t k, Tensor& idx) {
    HYMOE_CHECK(pos_first >= 0, "top_k_rows_causal: first position ", pos_first);
    top_k_launch(s, x, pos_first, k, idx, "top_k_rows_causal");
}

void indexer_mask(const Stream& s,
                  const Tensor& scores,
                  int64_t pos_first,
                  int64_t index_topk,
                  Tensor& idx,
                  Tensor& mask) {
    const int64_t n_q = scores.dim(0), n_k = scores.dim(-1), k = std::min(index_topk, n_k);
    HYMOE_CHECK(mask.device == Device::cuda && mask.dtype == DType::f32 &&
                    mask.shape == scores.shape && index_topk > 0 && idx.numel() == n_q * k,
                "indexer_mask: scores ",
                shape_string(scores.shape),
                " mask ",
                shape_string(mask.shape),
                " indices ",
                shape_string(idx.shape),
                " top-k ",
                index_topk);
    top_k_rows_causal(s, scores, pos_first, k, idx);
    if (n_q == 0)
        return;
    fill_kernel<<<grid_for(n_q * n_k, kBlock), kBlock, 0, s.get()>>>(
        mask.ptr<float>(), n_q * n_k, -INFINITY);
    keep_kernel<<<grid_for(n_q * k, kBlock), kBlock, 0, s.get()>>>(
        idx.ptr<int64_t>(), n_q, k, n_k, mask.ptr<float>());
    check_launch("indexer_mask");
}

}  // namespace hymoe::backend::cuda
