// MLA absorbed decode over a paged latent cache (hymoe/backend/cuda_ops.h). One block per
// (sequence, head): the threads score the keys (one key per thread at a time, a dot product of
// r_kv + d_r floats read from its page), the block reduces the maximum and the sum of the
// exponentials, and each thread then owns latent columns of ō and sums p_u · c_kv_u over the
// keys in key order (rows read coalesced across the columns). Scores wait in the caller's scratch.
#include <cmath>

#include "hymoe/backend/cuda_ops.h"
#include "kernels.h"

namespace hymoe::backend::cuda {

namespace {

// The cache row of token u of sequence b.
__device__ inline const float* key_row(const MlaDecodeParams& p, int b, int64_t u) {
    const int32_t page = p.block_table[static_cast<int64_t>(b) * p.max_pages + u / p.page_tokens];
    return p.pages + page * p.page_stride + (u % p.page_tokens) * p.row_stride;
}

__global__ void mla_decode_kernel(const MlaDecodeParams p) {
    const int b = blockIdx.x / p.n_head, h = blockIdx.x % p.n_head;
    const int64_t d_lat = p.r_kv + p.d_r;
    const float* q = p.q_hat + (static_cast<int64_t>(b) * p.n_head + h) * d_lat;
    float* sc = p.scores + (static_cast<int64_t>(b) * p.n_head + h) * p.max_keys;
    const int64_t n = p.n_keys[b];
    const int64_t n_j = p.selected ? p.n_selected : n;  // candidate keys j
    // key of candidate j, or −1 when it is masked
    auto key_of = [&](int64_t j) -> int64_t {
        if (!p.selected)
            return j;
        const int64_t u = p.selected[static_cast<int64_t>(b) * p.n_selected + j];
        return u >= 0 && u < n ? u : -1;
    };
    float mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < n_j; j += blockDim.x) {
        const int64_t u = key_of(j);
        float s = -INFINITY;
        if (u >= 0) {
            const float* row = key_row(p, b, u);
            float dot = 0.0f;
            for (int64_t x = 0; x < d_lat; ++x)
                dot += q[x] * row[x];
            s = dot * p.tau;
        }
        sc[j] = s;
        mx = fmaxf(mx, s);
    }
    mx = block_reduce(mx, Max{});
    float* o = p.o_bar + (static_cast<int64_t>(b) * p.n_head + h) * p.r_kv;
    if (mx == -INFINITY) {  // no key at all: ō = 0
        for (int64_t y = threadIdx.x; y < p.r_kv; y += blockDim.x)
            o[y] = 0.0f;
        return;
    }
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < n_j; j += blockDim.x) {
        const float e = expf(sc[j] - mx);
        sc[j] = e;
        sum += e;
    }
    const float inv = 1.0f / block_reduce(sum, Sum{});  // also orders the writes of sc above
    for (int64_t y = threadIdx.x; y < p.r_kv; y += blockDim.x) {
        float acc = 0.0f;
        for (int64_t j = 0; j < n_j; ++j) {
            const int64_t u = key_of(j);
            if (u >= 0)
                acc += sc[j] * key_row(p, b, u)[y];
        }
        o[y] = acc * inv;
    }
}

}  // namespace

void mla_decode(const Stream& s, const MlaDecodeParams& p) {
    HYMOE_CHECK(p.n_seq >= 0 && p.n_head > 0 && p.r_kv > 0 && p.d_r >= 0 && p.page_tokens > 0 &&
                    p.max_pages > 0 && p.max_keys > 0 && p.row_stride >= p.r_kv + p.d_r &&
                    (p.selected == nullptr || (p.n_selected > 0 && p.n_selected <= p.max_keys)),
                "mla_decode: B ",
                p.n_seq,
                " H ",
                p.n_head,
                " r_kv ",
                p.r_kv,
                " d_r ",
                p.d_r,
                " row stride ",
                p.row_stride,
                " max keys ",
                p.max_keys);
    HYMOE_CHECK(p.q_hat && p.pages && p.block_table && p.n_keys && p.scores && p.o_bar,
                "mla_decode: missing array");
    const int64_t blocks = static_cast<int64_t>(p.n_seq) * p.n_head;
    if (blocks == 0)
        return;
    HYMOE_CHECK(blocks <= INT32_MAX, "mla_decode: ", blocks, " blocks");
    mla_decode_kernel<<<static_cast<unsigned>(blocks), kBlock, 0, s.get()>>>(p);
    check_launch("mla_decode");
}

}  // namespace hymoe::backend::cuda
