// KDA decode step for a batch (hymoe/backend/cuda_fused.h): one token of each of B sequences,
// every head, one launch, states read in place from their pool slots. With ĝ = e^g the token's
// update S' = ĝ ⊙ S, u = β (v − S'ᵀk), S = S' + k uᵀ, o = Sᵀq is evaluated as
//   u = β (v − Σ_x (k ĝ)_x S_x),   o = Σ_x (q ĝ)_x S_x + (k·q) u,   S_x ← ĝ_x S_x + k_x u
// so the state is read once and written once. A block takes 32 value columns of one head of one
// sequence: lane = column (coalesced rows), warp w = rows [w·R, (w+1)·R) of S (R = ⌈K/8⌉ ≤ 16)
// held in registers between the two sums and the write; the eight warps' partial sums meet in
// shared memory and every thread adds them in the same order.
#include "hymoe/backend/cuda_fused.h"
#include "kernels.h"

namespace hymoe::backend::cuda {

namespace {

constexpr int kWarps = 8;
constexpr int kMaxK = 128;
constexpr int kMaxRows = kMaxK / kWarps;  // state rows a warp holds

template <class T>
__global__ void __launch_bounds__(kWarps * 32) kda_decode_kernel(const KdaBatchParams p) {
    __shared__ float kg[kMaxK], qg[kMaxK], gate[kMaxK], kraw[kMaxK];
    __shared__ float part_k[kWarps][32], part_q[kWarps][32];
    __shared__ float kq_dot;
    const int H = p.n_head, K = p.d_k, V = p.d_v;
    const int b = blockIdx.z, h = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int y = blockIdx.x * 32 + lane;
    const int64_t row = static_cast<int64_t>(b) * H + h;  // token row b, head h
    const T* q = static_cast<const T*>(p.q) + row * K;
    const T* k = static_cast<const T*>(p.k) + row * K;
    const float* g = p.g + row * K;
    const int tid = threadIdx.x;
    if (tid < K) {
        const float e = expf(g[tid]), kx = load(k, tid);
        gate[tid] = e;
        kraw[tid] = kx;
        kg[tid] = kx * e;
        qg[tid] = load(q, tid) * e;
    }
    if (warp == 0) {
        float dot = 0.0f;
        for (int x = lane; x < K; x += 32)
            dot += load(k, x) * load(q, x);
        for (int o = 16; o > 0; o >>= 1)
            dot += __shfl_xor_sync(0xffffffffu, dot, o);
        if (lane == 0)
            kq_dot = dot;
    }
    __syncthreads();
    const int64_t slot = p.state_slot ? p.state_slot[b] : b;
    float* S = p.S + (slot * H + h) * static_cast<int64_t>(K) * V;  // [K, V]
    const int rows = (K + kWarps - 1) / kWarps, x0 = warp * rows;
    float held[kMaxRows];
    float acc_k = 0.0f, acc_q = 0.0f;
#pragma unroll
    for (int r = 0; r < kMaxRows; ++r) {
        const int x = x0 + r;
        held[r] = 0.0f;
        if (r < rows && x < K && y < V) {
            held[r] = S[static_cast<int64_t>(x) * V + y];
            acc_k += kg[x] * held[r];
            acc_q += qg[x] * held[r];
        }
    }
    part_k[warp][lane] = acc_k;
    part_q[warp][lane] = acc_q;
    __syncthreads();
    float sk = 0.0f, sq = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
        sk += part_k[w][lane];
        sq += part_q[w][lane];
    }
    if (y >= V)
        return;
    const float u = p.beta[row] * (load(static_cast<const T*>(p.v), row * V + y) - sk);
    if (warp == 0)
        store(static_cast<T*>(p.o), row * V + y, sq + kq_dot * u);
#pragma unroll
    for (int r = 0; r < kMaxRows; ++r) {
        const int x = x0 + r;
        if (r < rows && x < K)
            S[static_cast<int64_t>(x) * V + y] = gate[x] * held[r] + kraw[x] * u;
    }
}

}  // namespace

void kda_decode_step(const Stream& s, const KdaBatchParams& p) {
    HYMOE_CHECK(p.n_seq >= 0 && p.n_seq <= 65535 && p.n_head > 0 && p.n_head <= 65535 &&
                    p.d_k > 0 && p.d_k <= kMaxK && p.d_v > 0 &&
                    (p.dtype == DType::f32 || p.dtype == DType::bf16),
                "kda_decode_step: B ",
                p.n_seq,
                " H ",
                p.n_head,
                " K ",
                p.d_k,
                " (at most ",
                kMaxK,
                ") V ",
                p.d_v);
    HYMOE_CHECK(p.n_seq == 0 || (p.q && p.k && p.v && p.g && p.beta && p.S && p.o),
                "kda_decode_step: missing array");
    if (p.n_seq == 0)
        return;
    const dim3 grid(static_cast<unsigned>((p.d_v + 31) / 32),
                    static_cast<unsigned>(p.n_head),
                    static_cast<unsigned>(p.n_seq));
    dispatch(p.dtype, [&](auto tag) {
        using T = decltype(tag);
        kda_decode_kernel<T><<<grid, kWarps * 32, 0, s.get()>>>(p);
    });
    check_launch("kda_decode_step");
}

}  // namespace hymoe::backend::cuda
