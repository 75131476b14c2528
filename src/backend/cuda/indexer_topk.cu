// The DSA lightning indexer with its top-k fused (hymoe/backend/cuda_fused.h), after DeepGEMM's
// MQA-logits layout (heads as the GEMM's M dimension, keys as N): a block takes
// queries_per_block queries (H_I·qb rows of q in shared memory, bf16) and one split of their
// keys, and per key tile of 64
//   1. gathers the keys (paged) into shared memory as bf16,
//   2. logits [qb·H_I, 64] = Q Kᵀ on tensor cores (fp32 accumulation), stored as w_j · ReLU(·),
//   3. sums each key's column over the heads in head order (ops::indexer_scores' order) and
//      admits the score to its query's candidate buffer when it beats the running k-th best,
//   4. when a buffer could overflow on the next tile, sorts it and keeps the top_k: the k-th
//      score becomes the bar. Keys come in ascending order, so a later key equal to the bar
//      loses the tie to the one already kept, and the strict bar is exact.
// At the end each buffer is sorted (score desc, key asc) and written: the first top_k keys (−1
// after the visible ones), or, with several splits, the split's candidates for the merge kernel,
// which sorts the n_split lists of each query together. No score matrix is ever stored.
#include <cmath>

#include "fused_common.cuh"
#include "hymoe/backend/cuda_fused.h"
#include "kernels.h"
#include "mma.cuh"
#include "smem_limit.cuh"

namespace hymoe::backend::cuda {

namespace {

using namespace mma;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxQb = 2;

template <class TQ, class TK>
__global__ void __launch_bounds__(kThreads, 1)
    indexer_topk_kernel(const IndexerTopkParams p, const IndexerPlan P) {
    extern __shared__ __align__(16) unsigned char smem[];
    bf16* qs = reinterpret_cast<bf16*>(smem + P.q_off);               // [qb·H, ld_q]
    bf16* ks = reinterpret_cast<bf16*>(smem + P.k_off);               // [BK, ld_q]
    float* logit = reinterpret_cast<float*>(smem + P.logit_off);      // [qb·H, ld_logit]
    uint64_t* cand = reinterpret_cast<uint64_t*>(smem + P.cand_off);  // [qb, capacity]
    float* ws = reinterpret_cast<float*>(smem + P.w_off);             // [qb·H]
    __shared__ int count[kMaxQb], visible[kMaxQb], full[kMaxQb];
    __shared__ float bar[kMaxQb];
    const int H = p.n_head, d = p.d, qb = P.queries_per_block, BK = P.key_tile, cap = P.capacity;
    const int rows = qb * H, tid = threadIdx.x, warp = tid >> 5;
    const int64_t r0 = static_cast<int64_t>(blockIdx.y) * qb;
    const int nq = static_cast<int>(p.n_q - r0 < qb ? p.n_q - r0 : qb);
    const int split = blockIdx.x;
    const int seq = p.seq ? p.seq[r0] : 0;  // qb = 2 only when every query is of sequence 0
    if (tid < kMaxQb) {
        visible[tid] = tid < nq ? p.visible[r0 + tid] : 0;
        count[tid] = 0;
        full[tid] = 0;
        bar[tid] = 0.0f;
    }
    const TQ* q = static_cast<const TQ*>(p.q);
    for (int e = tid; e < rows * d; e += kThreads) {
        const int row = e / d, x = e % d;  // row = qi·H + j
        qs[row * P.ld_q + x] =
            __float2bfloat16_rn(row / H < nq ? load(q, (r0 * H + row) * d + x) : 0.0f);
    }
    for (int row = tid; row < rows; row += kThreads)
        ws[row] = row / H < nq ? p.w[r0 * H + row] : 0.0f;
    __syncthreads();
    int vmax = 0;
    for (int qi = 0; qi < qb; ++qi)
        vmax = max(vmax, visible[qi]);
    const int chunk = ((vmax + P.n_split - 1) / P.n_split + BK - 1) / BK * BK;
    const int lo = split * chunk, hi = min(vmax, lo + chunk);
    const int m_tiles = rows / 16;
    for (int kt = lo; kt < hi; kt += BK) {
        for (int e = tid; e < BK * d; e += kThreads) {
            const int i = e / d, x = e % d, u = kt + i;
            ks[i * P.ld_q + x] =
                __float2bfloat16_rn(u < hi ? load(paged_row<TK>(p.keys, seq, u), x) : 0.0f);
        }
        __syncthreads();
        for (int job = warp; job < m_tiles * (BK / 16); job += kWarps) {
            const int mt = job % m_tiles, nt = job / m_tiles;
            FragC c[2];
            for (int kk = 0; kk < d; kk += 16) {
                FragA a;
                FragB b0, b1;
                load_a(a, qs + mt * 16 * P.ld_q + kk, P.ld_q);
                load_b2(b0, b1, ks + nt * 16 * P.ld_q + kk, P.ld_q);
                mma_bf16(c[0], a, b0);
                mma_bf16(c[1], a, b1);
            }
#pragma unroll
            for (int f = 0; f < 2; ++f)
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const int row = mt * 16 + c_row(i);
                    logit[row * P.ld_logit + nt * 16 + f * 8 + c_col(i)] =
                        ws[row] * fmaxf(c[f].x[i], 0.0f);
                }
        }
        __syncthreads();
        if (tid < qb * BK) {
            const int qi = tid / BK, i = tid % BK, u = kt + i;
            float score = 0.0f;
            for (int j = 0; j < H; ++j)
                score += logit[(qi * H + j) * P.ld_logit + i];
            if (u < hi && u < visible[qi] && (!full[qi] || score > bar[qi])) {
                const int at = atomicAdd(&count[qi], 1);
                cand[qi * cap + at] = candidate(score, u);
            }
        }
        __syncthreads();
        for (int qi = 0; qi < qb; ++qi) {
            if (count[qi] <= cap - BK)
                continue;
            uint64_t* c = cand + qi * cap;
            for (int e = count[qi] + tid; e < cap; e += kThreads)
                c[e] = 0;
            bitonic_sort_desc(c, cap);
            if (tid == 0) {
                count[qi] = p.top_k;
                full[qi] = 1;
                bar[qi] = candidate_score(c[p.top_k - 1]);
            }
            __syncthreads();
        }
    }
    for (int qi = 0; qi < nq; ++qi) {
        uint64_t* c = cand + qi * cap;
        for (int e = count[qi] + tid; e < cap; e += kThreads)
            c[e] = 0;
        bitonic_sort_desc(c, cap);
        const int64_t r = r0 + qi;
        for (int e = tid; e < p.top_k; e += kThreads) {
            if (P.n_split == 1)
                p.idx[r * p.top_k + e] = candidate_key(c[e]);
            else
                static_cast<uint64_t*>(p.scratch)[(r * P.n_split + split) * p.top_k + e] = c[e];
        }
    }
}

// One block per query: the n_split sorted lists of its candidates, sorted together.
__global__ void __launch_bounds__(kThreads)
    indexer_merge_kernel(const IndexerTopkParams p, const IndexerPlan P) {
    extern __shared__ __align__(16) unsigned char smem[];
    uint64_t* c = reinterpret_cast<uint64_t*>(smem);
    const int n = P.merge_smem_bytes / 8, total = P.n_split * p.top_k;
    const int64_t r = blockIdx.x;
    const uint64_t* from = static_cast<const uint64_t*>(p.scratch) + r * total;
    for (int e = threadIdx.x; e < n; e += kThreads)
        c[e] = e < total ? from[e] : 0;
    bitonic_sort_desc(c, n);
    for (int e = threadIdx.x; e < p.top_k; e += kThreads)
        p.idx[r * p.top_k + e] = candidate_key(c[e]);
}

template <class TQ, class TK>
void launch(const Stream& s, const IndexerTopkParams& p, const IndexerPlan& P) {
    constexpr auto kernel = indexer_topk_kernel<TQ, TK>;
    allow_dynamic_smem<kernel>("indexer_topk");
    const dim3 grid(static_cast<unsigned>(P.n_split),
                    static_cast<unsigned>((p.n_q + P.queries_per_block - 1) / P.queries_per_block));
    kernel<<<grid, kThreads, P.smem_bytes, s.get()>>>(p, P);
}

}  // namespace

void indexer_topk(const Stream& s, const IndexerTopkParams& p, const IndexerPlan& P) {
    HYMOE_CHECK(P.supported, "indexer_topk: ", P.why ? P.why : "no plan");
    HYMOE_CHECK(p.n_q >= 0 && p.n_q <= P.n_q && p.n_head == P.n_head && p.d == P.d &&
                    p.top_k == P.top_k && p.n_q <= 65535 * P.queries_per_block && p.top_k > 0 &&
                    (p.n_head * P.queries_per_block) % 16 == 0 && p.d % 16 == 0 &&
                    P.capacity >= p.top_k + P.key_tile &&
                    (P.queries_per_block == 1 || p.seq == nullptr) &&
                    (p.q_dtype == DType::f32 || p.q_dtype == DType::bf16) &&
                    (p.keys.dtype == DType::f32 || p.keys.dtype == DType::bf16),
                "indexer_topk: n_q ",
                p.n_q,
                " H_I ",
                p.n_head,
                " d_I ",
                p.d,
                " top_k ",
                p.top_k,
                " against its plan (n_q ",
                P.n_q,
                " H_I ",
                P.n_head,
                " d_I ",
                P.d,
                " top_k ",
                P.top_k,
                ", ",
                P.queries_per_block,
                " queries a block, capacity ",
                P.capacity,
                ")");
    HYMOE_CHECK(p.n_q == 0 || (p.q && p.w && p.visible && p.keys.rows && p.idx &&
                               (P.n_split == 1 || p.scratch)),
                "indexer_topk: missing array");
    if (p.n_q == 0)
        return;
    dispatch(p.q_dtype, [&](auto qtag) {
        dispatch(p.keys.dtype, [&](auto ktag) { launch<decltype(qtag), decltype(ktag)>(s, p, P); });
    });
    check_launch("indexer_topk");
    if (P.n_split > 1) {
        allow_dynamic_smem<indexer_merge_kernel>("indexer_topk merge");
        indexer_merge_kernel<<<static_cast<unsigned>(p.n_q),
                               kThreads,
                               P.merge_smem_bytes,
                               s.get()>>>(p, P);
        check_launch("indexer_topk merge");
    }
}

}  // namespace hymoe::backend::cuda
