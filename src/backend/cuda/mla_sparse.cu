// Sparse MLA attention in the absorbed (MQA) form (hymoe/backend/cuda_fused.h), FlashMLA's
// sparse decode: a block takes one query row and 16·RB heads (RB = row_blocks), with q̂ [16·RB,
// r_kv + d_r] in shared memory as bf16, and walks the query's selected keys in tiles of 64:
//   1. gathers the tile's latent rows [c_kv | k_r] from their pages once, as bf16, for every head;
//   2. scores S = τ q̂ Lᵀ on tensor cores, −inf for invalid entries (−1 or ≥ visible);
//   3. online softmax per head row (fp32): m' = max(m, max S), α = e^{m − m'}, P = e^{S − m'} as
//      bf16, l' = α l + Σ P (of the rounded P);
//   4. ō ← α ō + P C_kv on tensor cores, ō in registers.
// Warps: warp = (row block rb, column split cs) with CS = 8 / RB splits; for scores warp (rb, cs)
// takes keys [cs·64/CS, ...), for ō latent columns [cs·r_kv/CS, ...); one warp per row block
// (cs = 0) keeps the softmax statistics. At the end ō / l (0 when l = 0) goes out in fp32.
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
constexpr int kMaxOTiles = 16;  // n8 tiles of ō per warp: r_kv / CS / 8

template <class TC>
__global__ void __launch_bounds__(kThreads, 1)
    mla_sparse_kernel(const MlaSparseParams p, const MlaSparsePlan P) {
    extern __shared__ __align__(16) unsigned char smem[];
    bf16* qs = reinterpret_cast<bf16*>(smem + P.q_off);           // [rows, ld_lat]
    bf16* ks = reinterpret_cast<bf16*>(smem + P.k_off);           // [BK, ld_lat]
    float* sc = reinterpret_cast<float*>(smem + P.score_off);     // [rows, ld_score]
    bf16* pr = reinterpret_cast<bf16*>(smem + P.prob_off);        // [rows, ld_prob]
    float* m_run = reinterpret_cast<float*>(smem + P.stat_off);   // [rows]
    float* l_run = m_run + 16 * P.row_blocks;                     // [rows]
    float* alpha = l_run + 16 * P.row_blocks;                     // [rows]
    int32_t* kid = reinterpret_cast<int32_t*>(smem + P.key_off);  // [BK]
    const int RB = P.row_blocks, CS = kWarps / RB, rows = 16 * RB, BK = P.key_tile;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, rb = warp / CS, cs = warp % CS;
    const int H = p.n_head, d_lat = p.r_kv + p.d_r, h0 = blockIdx.x * rows;
    const int64_t r = blockIdx.y;
    const int seq = p.seq ? p.seq[r] : 0, visible = p.visible[r];
    for (int e = tid; e < rows * d_lat; e += kThreads) {
        const int i = e / d_lat, x = e % d_lat, h = h0 + i;
        qs[i * P.ld_lat + x] = __float2bfloat16_rn(h < H ? p.q_hat[(r * H + h) * d_lat + x] : 0.0f);
    }
    if (tid < rows) {
        m_run[tid] = -INFINITY;
        l_run[tid] = 0.0f;
    }
    __syncthreads();
    const int key_width = BK / CS;      // keys of a warp's score slice (8 or 16)
    const int col_width = p.r_kv / CS;  // ō columns of a warp
    const int o_tiles = col_width / 8;  // ≤ kMaxOTiles, even
    FragC o[kMaxOTiles];
    for (int kt = 0; kt < p.n_selected; kt += BK) {
        if (tid < BK) {
            const int j = kt + tid;
            const int u = j < p.n_selected ? p.selected[r * p.n_selected + j] : -1;
            kid[tid] = u >= 0 && u < visible ? u : -1;
        }
        __syncthreads();
        for (int e = tid; e < BK * d_lat; e += kThreads) {
            const int i = e / d_lat, x = e % d_lat, u = kid[i];
            ks[i * P.ld_lat + x] =
                __float2bfloat16_rn(u >= 0 ? load(paged_row<TC>(p.cache, seq, u), x) : 0.0f);
        }
        __syncthreads();
        {
            FragC c[2];
            const bf16* a_rows = qs + rb * 16 * P.ld_lat;
            const bf16* b_rows = ks + cs * key_width * P.ld_lat;
            for (int kk = 0; kk < d_lat; kk += 16) {
                FragA a;
                load_a(a, a_rows + kk, P.ld_lat);
                if (key_width == 16) {
                    FragB b0, b1;
                    load_b2(b0, b1, b_rows + kk, P.ld_lat);
                    mma_bf16(c[0], a, b0);
                    mma_bf16(c[1], a, b1);
                } else {
                    FragB b0;
                    load_b(b0, b_rows + kk, P.ld_lat);
                    mma_bf16(c[0], a, b0);
                }
            }
#pragma unroll
            for (int f = 0; f < 2; ++f)
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    if (f * 8 >= key_width)
                        continue;
                    const int col = cs * key_width + f * 8 + c_col(i);
                    sc[(rb * 16 + c_row(i)) * P.ld_score + col] =
                        kid[col] >= 0 ? c[f].x[i] * p.tau : -INFINITY;
                }
        }
        __syncthreads();
        if (cs == 0) {  // two lanes per row, half the tile's keys each
            const int row = rb * 16 + (lane >> 1), half = BK / 2, k0 = (lane & 1) * half;
            const float* s_row = sc + row * P.ld_score;
            float mx = -INFINITY;
            for (int k = k0; k < k0 + half; ++k)
                mx = fmaxf(mx, s_row[k]);
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            const float m_old = m_run[row], m_new = fmaxf(m_old, mx);
            const float a = m_new == -INFINITY ? 1.0f : expf(m_old - m_new);
            float sum = 0.0f;
            for (int k = k0; k < k0 + half; ++k) {
                const bf16 e =
                    __float2bfloat16_rn(s_row[k] == -INFINITY ? 0.0f : expf(s_row[k] - m_new));
                pr[row * P.ld_prob + k] = e;
                sum += __bfloat162float(e);
            }
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            if ((lane & 1) == 0) {
                m_run[row] = m_new;
                l_run[row] = l_run[row] * a + sum;
                alpha[row] = a;
            }
        }
        __syncthreads();
        {
            const int g = lane >> 2;
            const float a_lo = alpha[rb * 16 + g], a_hi = alpha[rb * 16 + g + 8];
#pragma unroll
            for (int j = 0; j < kMaxOTiles; ++j) {
                o[j].x[0] *= a_lo;
                o[j].x[1] *= a_lo;
                o[j].x[2] *= a_hi;
                o[j].x[3] *= a_hi;
            }
            for (int kk = 0; kk < BK; kk += 16) {
                FragA a;
                load_a(a, pr + rb * 16 * P.ld_prob + kk, P.ld_prob);
#pragma unroll
                for (int j = 0; j < kMaxOTiles; j += 2) {
                    if (j < o_tiles) {
                        FragB b0, b1;
                        load_b2_trans(
                            b0, b1, ks + kk * P.ld_lat + cs * col_width + j * 8, P.ld_lat);
                        mma_bf16(o[j], a, b0);
                        mma_bf16(o[j + 1], a, b1);
                    }
                }
            }
        }
        __syncthreads();
    }
    const int g = lane >> 2;
    const float l_lo = l_run[rb * 16 + g], l_hi = l_run[rb * 16 + g + 8];
    const float inv_lo = l_lo > 0.0f ? 1.0f / l_lo : 0.0f,
                inv_hi = l_hi > 0.0f ? 1.0f / l_hi : 0.0f;
#pragma unroll
    for (int j = 0; j < kMaxOTiles; ++j) {
        if (j >= o_tiles)
            continue;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int h = h0 + rb * 16 + c_row(i);
            if (h < H)
                p.o_bar[(r * H + h) * p.r_kv + cs * col_width + j * 8 + c_col(i)] =
                    o[j].x[i] * (i < 2 ? inv_lo : inv_hi);
        }
    }
}

}  // namespace

void mla_sparse(const Stream& s, const MlaSparseParams& p, const MlaSparsePlan& P) {
    HYMOE_CHECK(P.supported, "mla_sparse: ", P.why ? P.why : "no plan");
    const int CS = kWarps / P.row_blocks;
    HYMOE_CHECK(p.n_q >= 0 && p.n_q <= 65535 && p.n_head == P.n_head && p.r_kv == P.r_kv &&
                    p.d_r == P.d_r && p.n_head > 0 &&
                    p.n_head <= 16 * P.row_blocks * P.head_tiles && (p.r_kv + p.d_r) % 16 == 0 &&
                    p.r_kv % (16 * CS) == 0 && p.r_kv / CS / 8 <= kMaxOTiles && p.n_selected >= 0 &&
                    (p.cache.dtype == DType::f32 || p.cache.dtype == DType::bf16),
                "mla_sparse: n_q ",
                p.n_q,
                " H ",
                p.n_head,
                " r_kv ",
                p.r_kv,
                " d_r ",
                p.d_r,
                " against its plan (H ",
                P.n_head,
                " r_kv ",
                P.r_kv,
                " d_r ",
                P.d_r,
                ", ",
                P.row_blocks,
                " row blocks)");
    HYMOE_CHECK(p.n_q == 0 || (p.q_hat && p.cache.rows && p.visible && p.o_bar &&
                               (p.n_selected == 0 || p.selected)),
                "mla_sparse: missing array");
    if (p.n_q == 0)
        return;
    dispatch(p.cache.dtype, [&](auto tag) {
        constexpr auto kernel = mla_sparse_kernel<decltype(tag)>;
        allow_dynamic_smem<kernel>("mla_sparse");
        const dim3 grid(static_cast<unsigned>(P.head_tiles), static_cast<unsigned>(p.n_q));
        kernel<<<grid, kThreads, P.smem_bytes, s.get()>>>(p, P);
    });
    check_launch("mla_sparse");
}

}  // namespace hymoe::backend::cuda
