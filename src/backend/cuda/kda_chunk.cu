// KDA chunked prefill, fused (hymoe/backend/cuda_fused.h): one block per (value block, head,
// sequence) runs the sequence's chunks of C = 64 tokens in order, the state slice S [K, bv] in
// fp32 shared memory throughout, every WY intermediate of a chunk on chip. The chunk math is
// ops::kda_chunked's (src/backend/cpu/kda_scan.cpp) with two changes of evaluation:
//   - decays are products of a = e^g, never exponentials of differences: e^{Γ_i − Γ_j} =
//     Π_{j<l≤i} a_l (every factor ≤ 1: no overflow, however strong the decay; one exp per input);
//   - the causal triangles M = β·[k_i·(k_j e^{Γ_i − Γ_j})] and Aqk come in 16-row sub-blocks: the
//     diagonal ones on CUDA cores in fp32 (running products down each row), the off-diagonal ones
//     on tensor cores as (x_i e^{Γ_i − Γ_r}) · (k_j e^{Γ_r − Γ_j})ᵀ with r the row ending the
//     sub-block before i's (both factors ≤ 1), fla's secondary chunking.
// Then T = (I + M)^{-1} Diag(β) (16×16 diagonal blocks by forward substitution, off-diagonal
// blocks by increasing distance, fp32), and on tensor cores (bf16 operands, fp32 accumulation):
//   W = T (K ⊙ e^Γ),  V' = T V − W S,  O = (Q ⊙ e^Γ) S + Aqk V',  S ← e^{Γ_C} ⊙ S + (K ⊙ e^{Γ_C −
//   Γ})ᵀ V'.
// A short last chunk is padded with q = k = v = g = β = 0, which leaves every product exact.
// Phases of a chunk, separated by barriers (regions as in KdaChunkLayout):
//   stage      a32, q16, k16, beta               ← q, k, g, β of the chunk
//   factors    qi16, ki16, r16                   ← per-column products within sub-blocks
//   triangles  akk32, aqk32                      ← sub-block products
//   chunk      qg16, kg16, kl16, dec             ← per-column products over the chunk
//   prepare    aqk16, v16; akk32 ← M             (a32 q16 k16 are dead from here)
//   solve      aqk32 ← N (diagonal blocks, then distances 1..3 through x32); t16
//   W          w16 ← −T Kg
//   V'         vp16 ← T V + (−W) S
//   O, S       o → global; s32 ← dec ⊙ s32 + Klᵀ V'
//   refresh    s16 ← s32
#include "hymoe/backend/cuda_fused.h"
#include "kernels.h"
#include "mma.cuh"
#include "smem_limit.cuh"

namespace hymoe::backend::cuda {

namespace {

using namespace mma;

constexpr int kC = kKdaChunk;
constexpr int kB = kKdaSub;
constexpr int kNB = kC / kB;  // sub-blocks per chunk
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

// Sub-block pairs (I > J) in the order of r16's slices: (1,0) (2,0) (2,1) (3,0) (3,1) (3,2).
__device__ constexpr int pair_index(int I, int J) {
    return I * (I - 1) / 2 + J;
}
__device__ constexpr int pair_row(int p) {
    return p < 1 ? 1 : p < 3 ? 2 : 3;
}
__device__ constexpr int pair_col(int p) {
    return p - pair_index(pair_row(p), 0);
}

__device__ inline float bf(const bf16 x) {
    return __bfloat162float(x);
}
__device__ inline bf16 to_bf(float x) {
    return __float2bfloat16_rn(x);
}

__device__ inline float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// The block's shared-memory tiles (KdaChunkLayout's regions).
struct Tiles {
    float* a32;
    bf16 *q16, *k16, *qi16, *ki16, *r16, *qg16, *kg16, *kl16;
    float *akk32, *aqk32;
    bf16 *t16, *aqk16, *w16, *vp16, *v16;
    float* x32;
    float* s32;
    bf16* s16;
    float *beta, *dec;
};

__device__ Tiles carve(unsigned char* smem, const KdaChunkLayout& L) {
    Tiles t;
    t.a32 = reinterpret_cast<float*>(smem + L.a32);
    t.q16 = reinterpret_cast<bf16*>(smem + L.q16);
    t.k16 = reinterpret_cast<bf16*>(smem + L.k16);
    t.qi16 = reinterpret_cast<bf16*>(smem + L.qi16);
    t.ki16 = reinterpret_cast<bf16*>(smem + L.ki16);
    t.r16 = reinterpret_cast<bf16*>(smem + L.r16);
    t.qg16 = reinterpret_cast<bf16*>(smem + L.qg16);
    t.kg16 = reinterpret_cast<bf16*>(smem + L.kg16);
    t.kl16 = reinterpret_cast<bf16*>(smem + L.kl16);
    t.akk32 = reinterpret_cast<float*>(smem + L.akk32);
    t.aqk32 = reinterpret_cast<float*>(smem + L.aqk32);
    t.t16 = reinterpret_cast<bf16*>(smem + L.t16);
    t.aqk16 = reinterpret_cast<bf16*>(smem + L.aqk16);
    t.w16 = reinterpret_cast<bf16*>(smem + L.w16);
    t.vp16 = reinterpret_cast<bf16*>(smem + L.vp16);
    t.v16 = reinterpret_cast<bf16*>(smem + L.v16);
    t.x32 = reinterpret_cast<float*>(smem + L.x32);
    t.s32 = reinterpret_cast<float*>(smem + L.s32);
    t.s16 = reinterpret_cast<bf16*>(smem + L.s16);
    t.beta = reinterpret_cast<float*>(smem + L.beta);
    t.dec = reinterpret_cast<float*>(smem + L.dec);
    return t;
}

// Where one block works: head h of sequence `seq`, value columns [y0, y0 + bv).
struct Work {
    int h, y0, H, K, V;
    int64_t t0;  // first token row of the chunk
    int L;       // tokens in the chunk
};

// stage: a = e^g, q, k as bf16 operands, β; zeros (and a = 1) past the chunk's end.
template <class T>
__device__ void stage(const KdaBatchParams& p, const KdaChunkLayout& L, const Work& w, Tiles& s) {
    const T* q = static_cast<const T*>(p.q);
    const T* k = static_cast<const T*>(p.k);
    for (int e = threadIdx.x; e < kC * w.K; e += kThreads) {
        const int i = e / w.K, x = e % w.K;
        float gv = 0.0f, qv = 0.0f, kv = 0.0f;
        if (i < w.L) {
            const int64_t at = ((w.t0 + i) * w.H + w.h) * w.K + x;
            gv = p.g[at];
            qv = load(q, at);
            kv = load(k, at);
        }
        s.a32[i * w.K + x] = expf(gv);
        s.q16[i * L.ld_k + x] = to_bf(qv);
        s.k16[i * L.ld_k + x] = to_bf(kv);
    }
    const int i = threadIdx.x;
    if (i < kC)
        s.beta[i] = i < w.L ? p.beta[(w.t0 + i) * w.H + w.h] : 0.0f;
}

// factors: thread x < K walks column x. Sub-block I ≥ 1: qi, ki = (q, k)_i · Π_{16I ≤ l ≤ i} a_l
// (reference row r = 16I − 1). Sub-block J < 3, for every I > J: r16(I, J)_j = k_j ·
// Π_{j < l < 16J+16} a_l · Π_{J < b < I} (product of sub-block b).
__device__ void sub_block_factors(const KdaChunkLayout& L, int K, Tiles& s) {
    const int x = threadIdx.x;
    if (x >= K)
        return;
    float tot[kNB];
#pragma unroll
    for (int b = 0; b < kNB; ++b) {
        float f = 1.0f;
        for (int r = 0; r < kB; ++r) {
            const int i = b * kB + r;
            f *= s.a32[i * K + x];
            if (b > 0) {
                const int row = i - kB;
                s.qi16[row * L.ld_k + x] = to_bf(bf(s.q16[i * L.ld_k + x]) * f);
                s.ki16[row * L.ld_k + x] = to_bf(bf(s.k16[i * L.ld_k + x]) * f);
            }
        }
        tot[b] = f;
    }
#pragma unroll
    for (int J = 0; J < kNB - 1; ++J) {
        float e = 1.0f;  // Π_{j < l < 16J+16} a_l
        for (int r = kB - 1; r >= 0; --r) {
            const int j = J * kB + r;
            const float kj = bf(s.k16[j * L.ld_k + x]) * e;
            float fac = 1.0f;
#pragma unroll
            for (int I = J + 1; I < kNB; ++I) {
                s.r16[(pair_index(I, J) * kB + r) * L.ld_k + x] = to_bf(kj * fac);
                fac *= tot[I];
            }
            e *= s.a32[j * K + x];
        }
    }
}

// triangles: Akk[i][j] = Σ_κ k_iκ k_jκ e^{Γ_iκ − Γ_jκ} (j < i; 0 on and above the diagonal) and
// Aqk[i][j] the same with q_i (j ≤ i; 0 above). Off-diagonal sub-blocks: 12 tensor-core tiles;
// diagonal ones: warp w takes rows w, w + 8, ..., lanes split κ and walk j down from i.
__device__ void triangles(const KdaChunkLayout& L, int K, Tiles& s) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int job = warp; job < 12; job += kWarps) {
        const bool qk = job >= 6;
        const int pr = job % 6, I = pair_row(pr), J = pair_col(pr);
        const bf16* a = (qk ? s.qi16 : s.ki16) + (I - 1) * kB * L.ld_k;
        const bf16* b = s.r16 + pr * kB * L.ld_k;
        FragC c0, c1;
        for (int kk = 0; kk < K; kk += 16) {
            FragA fa;
            FragB b0, b1;
            load_a(fa, a + kk, L.ld_k);
            load_b2(b0, b1, b + kk, L.ld_k);
            mma_bf16(c0, fa, b0);
            mma_bf16(c1, fa, b1);
        }
        float* out = (qk ? s.aqk32 : s.akk32) + I * kB * L.ld_cf + J * kB;
        store_c(out, L.ld_cf, c0);
        store_c(out + 8, L.ld_cf, c1);
    }
    for (int i = warp; i < kC; i += kWarps) {
        const int first = i / kB * kB;
        float qi[4], ki[4], E[4];
#pragma unroll
        for (int m = 0; m < 4; ++m) {
            const int x = lane + 32 * m;
            qi[m] = x < K ? bf(s.q16[i * L.ld_k + x]) : 0.0f;
            ki[m] = x < K ? bf(s.k16[i * L.ld_k + x]) : 0.0f;
            E[m] = 1.0f;  // e^{Γ_i − Γ_j} for the current j
        }
        for (int j = i; j >= first; --j) {
            float pk = 0.0f, pq = 0.0f;
#pragma unroll
            for (int m = 0; m < 4; ++m) {
                const int x = lane + 32 * m;
                if (x < K) {
                    const float kj = bf(s.k16[j * L.ld_k + x]) * E[m];
                    pk += ki[m] * kj;
                    pq += qi[m] * kj;
                    E[m] *= s.a32[j * K + x];
                }
            }
            pk = warp_sum(pk);
            pq = warp_sum(pq);
            if (lane == 0) {
                s.akk32[i * L.ld_cf + j] = j < i ? pk : 0.0f;
                s.aqk32[i * L.ld_cf + j] = pq;
            }
        }
        for (int j = i + 1 + lane; j < kC; j += 32) {
            s.akk32[i * L.ld_cf + j] = 0.0f;
            s.aqk32[i * L.ld_cf + j] = 0.0f;
        }
    }
}

// chunk: thread x < K: qg, kg = (q, k) · Π_{l ≤ i} a_l; kl = k · Π_{l > i} a_l; dec = Π_l a_l.
__device__ void chunk_factors(const KdaChunkLayout& L, int K, Tiles& s) {
    const int x = threadIdx.x;
    if (x >= K)
        return;
    float pre = 1.0f;
    for (int i = 0; i < kC; ++i) {
        pre *= s.a32[i * K + x];
        s.qg16[i * L.ld_k + x] = to_bf(bf(s.q16[i * L.ld_k + x]) * pre);
        s.kg16[i * L.ld_k + x] = to_bf(bf(s.k16[i * L.ld_k + x]) * pre);
    }
    s.dec[x] = pre;
    float suf = 1.0f;
    for (int i = kC - 1; i >= 0; --i) {
        s.kl16[i * L.ld_k + x] = to_bf(bf(s.k16[i * L.ld_k + x]) * suf);
        suf *= s.a32[i * K + x];
    }
}

// prepare: Aqk as an operand, M = β_i · Akk in place, and the chunk's value columns.
template <class T, int BV>
__device__ void prepare(const KdaBatchParams& p, const KdaChunkLayout& L, const Work& w, Tiles& s) {
    for (int e = threadIdx.x; e < kC * kC; e += kThreads) {
        const int i = e / kC, j = e % kC;
        s.aqk16[i * L.ld_c + j] = to_bf(s.aqk32[i * L.ld_cf + j]);
        s.akk32[i * L.ld_cf + j] *= s.beta[i];
    }
    const T* v = static_cast<const T*>(p.v);
    for (int e = threadIdx.x; e < kC * BV; e += kThreads) {
        const int i = e / BV, y = e % BV;
        s.v16[i * L.ld_v + y] =
            to_bf(i < w.L ? load(v, ((w.t0 + i) * w.H + w.h) * w.V + w.y0 + y) : 0.0f);
    }
}

// solve: N = (I + M)^{-1} into aqk32 (unit lower triangular; entries above the diagonal blocks
// are never read), then t16 = N Diag(β) with zeros above the diagonal.
//   diagonal blocks: thread (b, j) solves column j of N_bb, N[i][j] = −Σ_{j ≤ l < i} M[i][l]
//   N[l][j]; N_IJ = −N_II Σ_{J ≤ l < I} M_Il N_lJ for distance I − J = 1, 2, 3 (X_J through x32).
__device__ void solve(const KdaChunkLayout& L, Tiles& s) {
    const float* M = s.akk32;
    float* N = s.aqk32;
    const int ld = L.ld_cf;
    if (threadIdx.x < kNB * kB) {
        const int o = threadIdx.x / kB * kB, jj = threadIdx.x % kB;
        float col[kB];
#pragma unroll
        for (int i = 0; i < kB; ++i) {
            float acc = 0.0f;
#pragma unroll
            for (int l = 0; l < i; ++l)
                acc += M[(o + i) * ld + o + l] * col[l];
            col[i] = i < jj ? 0.0f : i == jj ? 1.0f : -acc;
        }
#pragma unroll
        for (int i = 0; i < kB; ++i)
            N[(o + i) * ld + o + jj] = col[i];
    }
    __syncthreads();
    for (int dist = 1; dist < kNB; ++dist) {
        const int n_blk = kNB - dist;
        for (int e = threadIdx.x; e < n_blk * kB * kB; e += kThreads) {
            const int J = e / (kB * kB), r = e / kB % kB, c = e % kB, I = J + dist;
            float acc = 0.0f;
            for (int l = J * kB; l < I * kB; ++l)
                acc += M[(I * kB + r) * ld + l] * N[l * ld + J * kB + c];
            s.x32[(J * kB + r) * kB + c] = acc;
        }
        __syncthreads();
        for (int e = threadIdx.x; e < n_blk * kB * kB; e += kThreads) {
            const int J = e / (kB * kB), r = e / kB % kB, c = e % kB, I = J + dist;
            float acc = 0.0f;
#pragma unroll
            for (int l = 0; l < kB; ++l)
                acc += N[(I * kB + r) * ld + I * kB + l] * s.x32[(J * kB + l) * kB + c];
            N[(I * kB + r) * ld + J * kB + c] = -acc;
        }
        __syncthreads();
    }
    for (int e = threadIdx.x; e < kC * kC; e += kThreads) {
        const int i = e / kC, j = e % kC;
        s.t16[i * L.ld_c + j] = to_bf(j <= i ? N[i * ld + j] * s.beta[j] : 0.0f);
    }
}

// w16 = −T (K ⊙ e^Γ): 16×16 output tiles; T is lower triangular, so row tile m needs only the
// first m + 1 depth steps.
__device__ void products_w(const KdaChunkLayout& L, int K, Tiles& s) {
    const int warp = threadIdx.x >> 5;
    for (int job = warp; job < 4 * (K / 16); job += kWarps) {
        const int mt = job % 4, nt = job / 4;
        FragC c0, c1;
        for (int kk = 0; kk <= mt * 16; kk += 16) {
            FragA a;
            FragB b0, b1;
            load_a(a, s.t16 + mt * 16 * L.ld_c + kk, L.ld_c);
            load_b2_trans(b0, b1, s.kg16 + kk * L.ld_k + nt * 16, L.ld_k);
            mma_bf16(c0, a, b0);
            mma_bf16(c1, a, b1);
        }
        bf16* out = s.w16 + mt * 16 * L.ld_k + nt * 16;
        store_c_bf16(out, L.ld_k, c0, -1.0f);
        store_c_bf16(out + 8, L.ld_k, c1, -1.0f);
    }
}

// vp16 = T V + (−W) S.
template <int BV>
__device__ void products_vp(const KdaChunkLayout& L, int K, Tiles& s) {
    const int warp = threadIdx.x >> 5;
    for (int job = warp; job < 4 * (BV / 16); job += kWarps) {
        const int mt = job % 4, nt = job / 4;
        FragC c0, c1;
        for (int kk = 0; kk <= mt * 16; kk += 16) {
            FragA a;
            FragB b0, b1;
            load_a(a, s.t16 + mt * 16 * L.ld_c + kk, L.ld_c);
            load_b2_trans(b0, b1, s.v16 + kk * L.ld_v + nt * 16, L.ld_v);
            mma_bf16(c0, a, b0);
            mma_bf16(c1, a, b1);
        }
        for (int kk = 0; kk < K; kk += 16) {
            FragA a;
            FragB b0, b1;
            load_a(a, s.w16 + mt * 16 * L.ld_k + kk, L.ld_k);
            load_b2_trans(b0, b1, s.s16 + kk * L.ld_v + nt * 16, L.ld_v);
            mma_bf16(c0, a, b0);
            mma_bf16(c1, a, b1);
        }
        bf16* out = s.vp16 + mt * 16 * L.ld_v + nt * 16;
        store_c_bf16(out, L.ld_v, c0);
        store_c_bf16(out + 8, L.ld_v, c1);
    }
}

// O = (Q ⊙ e^Γ) S + Aqk V' to global (rows < L), and s32 ← dec ⊙ s32 + Klᵀ V' (reads s16 and
// vp16, writes only s32: the two kinds of job can share the phase).
template <class T, int BV>
__device__ void products_out(const KdaBatchParams& p,
                             const KdaChunkLayout& L,
                             const Work& w,
                             Tiles& s) {
    const int warp = threadIdx.x >> 5;
    const int o_jobs = 4 * (BV / 16), s_jobs = (w.K / 16) * (BV / 16);
    T* o = static_cast<T*>(p.o);
    for (int job = warp; job < o_jobs + s_jobs; job += kWarps) {
        FragC c[2];
        if (job < o_jobs) {
            const int mt = job % 4, nt = job / 4;
            for (int kk = 0; kk < w.K; kk += 16) {
                FragA a;
                FragB b0, b1;
                load_a(a, s.qg16 + mt * 16 * L.ld_k + kk, L.ld_k);
                load_b2_trans(b0, b1, s.s16 + kk * L.ld_v + nt * 16, L.ld_v);
                mma_bf16(c[0], a, b0);
                mma_bf16(c[1], a, b1);
            }
            for (int kk = 0; kk <= mt * 16; kk += 16) {
                FragA a;
                FragB b0, b1;
                load_a(a, s.aqk16 + mt * 16 * L.ld_c + kk, L.ld_c);
                load_b2_trans(b0, b1, s.vp16 + kk * L.ld_v + nt * 16, L.ld_v);
                mma_bf16(c[0], a, b0);
                mma_bf16(c[1], a, b1);
            }
#pragma unroll
            for (int f = 0; f < 2; ++f)
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const int row = mt * 16 + c_row(i);
                    if (row < w.L)
                        store(o,
                              ((w.t0 + row) * w.H + w.h) * w.V + w.y0 + nt * 16 + f * 8 + c_col(i),
                              c[f].x[i]);
                }
        } else {
            const int sj = job - o_jobs, xt = sj % (w.K / 16), nt = sj / (w.K / 16);
            float* base = s.s32 + xt * 16 * L.ld_s + nt * 16;
#pragma unroll
            for (int f = 0; f < 2; ++f)
#pragma unroll
                for (int i = 0; i < 4; ++i)
                    c[f].x[i] =
                        base[c_row(i) * L.ld_s + f * 8 + c_col(i)] * s.dec[xt * 16 + c_row(i)];
            for (int kk = 0; kk < kC; kk += 16) {
                FragA a;
                FragB b0, b1;
                load_a_trans(a, s.kl16 + kk * L.ld_k + xt * 16, L.ld_k);
                load_b2_trans(b0, b1, s.vp16 + kk * L.ld_v + nt * 16, L.ld_v);
                mma_bf16(c[0], a, b0);
                mma_bf16(c[1], a, b1);
            }
            store_c(base, L.ld_s, c[0]);
            store_c(base + 8, L.ld_s, c[1]);
        }
    }
}

template <class T, int BV>
__global__ void __launch_bounds__(kThreads, 1)
    kda_chunk_kernel(const KdaBatchParams p, const KdaChunkLayout L) {
    extern __shared__ __align__(16) unsigned char smem[];
    Tiles s = carve(smem, L);
    Work w;
    w.h = blockIdx.y;
    w.y0 = blockIdx.x * BV;
    w.H = p.n_head;
    w.K = p.d_k;
    w.V = p.d_v;
    const int seq = blockIdx.z;
    const int64_t begin = p.seq_start[seq], end = p.seq_start[seq + 1];
    const int64_t slot = p.state_slot ? p.state_slot[seq] : seq;
    float* S = p.S + (slot * w.H + w.h) * static_cast<int64_t>(w.K) * w.V + w.y0;  // row x: S[x·V]
    for (int e = threadIdx.x; e < w.K * BV; e += kThreads) {
        const int x = e / BV, y = e % BV;
        const float v = S[static_cast<int64_t>(x) * w.V + y];
        s.s32[x * L.ld_s + y] = v;
        s.s16[x * L.ld_v + y] = to_bf(v);
    }
    __syncthreads();
    for (w.t0 = begin; w.t0 < end; w.t0 += kC) {
        w.L = static_cast<int>(end - w.t0 < kC ? end - w.t0 : kC);
        stage<T>(p, L, w, s);
        __syncthreads();
        sub_block_factors(L, w.K, s);
        __syncthreads();
        triangles(L, w.K, s);
        __syncthreads();
        chunk_factors(L, w.K, s);
        __syncthreads();
        prepare<T, BV>(p, L, w, s);
        __syncthreads();
        solve(L, s);
        __syncthreads();
        products_w(L, w.K, s);
        __syncthreads();
        products_vp<BV>(L, w.K, s);
        __syncthreads();
        products_out<T, BV>(p, L, w, s);
        __syncthreads();
        for (int e = threadIdx.x; e < w.K * BV; e += kThreads) {
            const int x = e / BV, y = e % BV;
            s.s16[x * L.ld_v + y] = to_bf(s.s32[x * L.ld_s + y]);
        }
        __syncthreads();
    }
    for (int e = threadIdx.x; e < w.K * BV; e += kThreads) {
        const int x = e / BV, y = e % BV;
        S[static_cast<int64_t>(x) * w.V + y] = s.s32[x * L.ld_s + y];
    }
}

template <class T, int BV>
void launch(const Stream& s, const KdaBatchParams& p, const KdaChunkLayout& L) {
    constexpr auto kernel = kda_chunk_kernel<T, BV>;
    allow_dynamic_smem<kernel>("kda_chunk_prefill");
    const dim3 grid(static_cast<unsigned>(p.d_v / BV),
                    static_cast<unsigned>(p.n_head),
                    static_cast<unsigned>(p.n_seq));
    kernel<<<grid, kThreads, L.bytes, s.get()>>>(p, L);
}

}  // namespace

void kda_chunk_prefill(const Stream& s, const KdaBatchParams& p) {
    const KdaChunkLayout L = kda_chunk_layout(p.d_k, p.d_v);
    HYMOE_CHECK(
        L.supported, "kda_chunk_prefill: K ", p.d_k, " V ", p.d_v, ": ", L.why ? L.why : "");
    HYMOE_CHECK(p.n_seq >= 0 && p.n_seq <= 65535 && p.n_head > 0 && p.n_head <= 65535 &&
                    (p.dtype == DType::f32 || p.dtype == DType::bf16),
                "kda_chunk_prefill: B ",
                p.n_seq,
                " H ",
                p.n_head,
                " dtype ",
                to_string(p.dtype));
    HYMOE_CHECK(p.n_seq == 0 || (p.seq_start && p.q && p.k && p.v && p.g && p.beta && p.S && p.o),
                "kda_chunk_prefill: missing array");
    if (p.n_seq == 0)
        return;
    dispatch(p.dtype, [&](auto tag) {
        using T = decltype(tag);
        if (L.bv == 64)
            launch<T, 64>(s, p, L);
        else
            launch<T, 32>(s, p, L);
    });
    check_launch("kda_chunk_prefill");
}

}  // namespace hymoe::backend::cuda
