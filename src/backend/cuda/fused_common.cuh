// Device pieces shared by the DSA kernels (src/backend/cuda/indexer_topk.cu, mla_sparse.cu):
// paged row lookup, 64-bit (score, key) candidates that order like the CPU's top-k, and a
// block-wide bitonic sort in shared memory.
#pragma once

#include <cstdint>

#include "hymoe/backend/cuda_fused.h"

namespace hymoe::backend::cuda {

// Row u of block-table row `seq` (PagedRows's rule).
template <class T>
__device__ inline const T* paged_row(const PagedRows& r, int seq, int64_t u) {
    const T* base = static_cast<const T*>(r.rows);
    if (r.block_table == nullptr)
        return base + u * r.row_stride;
    const int64_t page = r.block_table[static_cast<int64_t>(seq) * r.max_pages + u / r.page_tokens];
    return base + page * r.page_stride + (u % r.page_tokens) * r.row_stride;
}

// A candidate: the score's bits mapped to an unsigned order (high word) and ~key (low word), so
// that the larger candidate has the larger score, or the same score and the smaller key
// (ops::top_k's order). 0 is below every candidate: "none".
__device__ inline uint64_t candidate(float score, int64_t key) {
    const uint32_t b = __float_as_uint(score);
    const uint32_t ordered = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
    return (static_cast<uint64_t>(ordered) << 32) |
           static_cast<uint32_t>(~static_cast<uint32_t>(key));
}
__device__ inline float candidate_score(uint64_t c) {
    const uint32_t o = static_cast<uint32_t>(c >> 32);
    return __uint_as_float((o & 0x80000000u) ? (o & 0x7fffffffu) : ~o);
}
__device__ inline int32_t candidate_key(uint64_t c) {
    return c == 0 ? -1 : static_cast<int32_t>(~static_cast<uint32_t>(c));
}

// Sorts a[0, n) descending (n a power of two) with every thread of the block; ends synchronised.
__device__ inline void bitonic_sort_desc(uint64_t* a, int n) {
    for (int size = 2; size <= n; size <<= 1)
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            __syncthreads();
            for (int i = threadIdx.x; i < n / 2; i += blockDim.x) {
                const int lo = 2 * i - (i & (stride - 1)), hi = lo + stride;
                const bool desc = (lo & size) == 0;  // direction of this run of `size`
                const uint64_t x = a[lo], y = a[hi];
                if ((x < y) == desc) {
                    a[lo] = y;
                    a[hi] = x;
                }
            }
        }
    __syncthreads();
}

}  // namespace hymoe::backend::cuda
