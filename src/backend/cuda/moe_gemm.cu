// The routed experts of an MoE layer as two grouped GEMMs and the combine
// (hymoe/backend/cuda_fused.h). Each GEMM is one launch over every expert: block (m, n) finds
// the expert owning row tile m in the dispatch plan's tile_start (a binary search; tiles past
// the last are idle blocks, since the grid is sized for any routing), and computes a
// 128-row tile of that expert's rows on tensor cores (bf16 mma.sync m16n8k16, fp32
// accumulation), fed by a three-stage cp.async pipeline of 32-deep k slices:
//   up:   h[rows, 64 cols of I] = SiLU(x W1ᵀ) ⊙ (x W3ᵀ), the A rows gathered from x through
//         token_of (no permuted copy of x), both products in one pass over the k slices;
//   down: out[rows, 128 cols of d] = h W2ᵀ.
// Rows past an expert's last are zero-filled on load and not stored. 8 warps: 2 along rows
// (64 each) × 4 along columns. The combine then sums each token's top_k rows, weighted, in slot
// order (fp32), onto y.
#include "hymoe/backend/cuda_fused.h"
#include "kernels.h"
#include "mma.cuh"
#include "smem_limit.cuh"

namespace hymoe::backend::cuda {

namespace {

using namespace mma;

constexpr int kThreads = 256;
constexpr int kBM = kMoeTileRows;  // 128
constexpr int kBK = 32;
constexpr int kLd = kBK + 8;  // smem row stride: 80 bytes, conflict-free ldmatrix
constexpr int kStages = 3;
constexpr int kUpCols = 64;     // of I per up block (two matrices: 128 B columns)
constexpr int kDownCols = 128;  // of d per down block

// The tile's expert, first row and row count; false for an idle block.
struct RowTile {
    int expert, row0, rows;
};
__device__ inline bool find_tile(const MoeDispatch& d, int m, RowTile& t) {
    if (m >= d.tile_start[d.n_exp])
        return false;
    int lo = 0, hi = d.n_exp - 1;  // the last expert whose first tile is ≤ m
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (d.tile_start[mid] <= m)
            lo = mid;
        else
            hi = mid - 1;
    }
    t.expert = lo;
    t.row0 = d.offset[lo] + (m - d.tile_start[lo]) * kBM;
    t.rows = min(kBM, d.offset[lo + 1] - t.row0);
    return true;
}

// 16 bytes of row `row` of a [.., kLd] bf16 stage tile, from src when valid (else zeros).
__device__ inline void load_chunk(bf16* tile, int row, int part, const bf16* src, bool valid) {
    cp_async16(tile + row * kLd + part * 8, src, valid);
}

// The k slices of a block: for k0 = 0, 32, ..., `issue(stage, k0)` queues a slice's copies,
// `consume(stage)` multiplies it; three stages in flight.
template <class Issue, class Consume>
__device__ inline void pipeline(int depth, Issue issue, Consume consume) {
    const int n_k = depth / kBK;
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
        if (s < n_k)
            issue(s, s * kBK);
        cp_async_commit();
    }
    for (int kt = 0; kt < n_k; ++kt) {
        cp_async_wait<kStages - 2>();
        __syncthreads();
        const int next = kt + kStages - 1;
        if (next < n_k)
            issue(next % kStages, next * kBK);
        cp_async_commit();
        consume(kt % kStages);
    }
    cp_async_wait<0>();
}

__global__ void __launch_bounds__(kThreads, 1)
    moe_up_kernel(const MoeDispatch d, const MoeExpertParams p) {
    extern __shared__ __align__(16) unsigned char smem[];
    RowTile t;
    if (!find_tile(d, blockIdx.x, t))
        return;
    const int n0 = blockIdx.y * kUpCols, tid = threadIdx.x, warp = tid >> 5;
    const int wm = warp / 4, wn = warp % 4;     // rows wm·64.., columns wn·16.. of each matrix
    bf16* a_s = reinterpret_cast<bf16*>(smem);  // [stages][128][kLd]
    bf16* g_s = a_s + kStages * kBM * kLd;      // [stages][64][kLd] W1 rows
    bf16* u_s = g_s + kStages * kUpCols * kLd;  // [stages][64][kLd] W3 rows
    const bf16* x = static_cast<const bf16*>(p.x);
    const int64_t w_rows = static_cast<int64_t>(t.expert) * p.inter + n0;
    const bf16* w1 = static_cast<const bf16*>(p.w1) + w_rows * p.d;
    const bf16* w3 = static_cast<const bf16*>(p.w3) + w_rows * p.d;
    // this thread's A rows (two 16-byte chunks a slice) and their tokens
    const int a_row0 = tid / 4, a_row1 = a_row0 + 64, part = tid % 4;
    const bf16* x0 =
        x + static_cast<int64_t>(a_row0 < t.rows ? d.token_of[t.row0 + a_row0] : 0) * p.d;
    const bf16* x1 =
        x + static_cast<int64_t>(a_row1 < t.rows ? d.token_of[t.row0 + a_row1] : 0) * p.d;
    auto issue = [&](int s, int k0) {
        bf16* a = a_s + s * kBM * kLd;
        load_chunk(a, a_row0, part, x0 + k0 + part * 8, a_row0 < t.rows);
        load_chunk(a, a_row1, part, x1 + k0 + part * 8, a_row1 < t.rows);
        const int b_row = tid / 4;  // 64 rows × 4 chunks
        load_chunk(g_s + s * kUpCols * kLd, b_row, part, w1 + b_row * p.d + k0 + part * 8, true);
        load_chunk(u_s + s * kUpCols * kLd, b_row, part, w3 + b_row * p.d + k0 + part * 8, true);
    };
    FragC gate[4][2], up[4][2];  // [m16 tile][n8 tile]
    auto consume = [&](int s) {
        const bf16* a = a_s + s * kBM * kLd + wm * 64 * kLd;
        const bf16* g = g_s + s * kUpCols * kLd + wn * 16 * kLd;
        const bf16* u = u_s + s * kUpCols * kLd + wn * 16 * kLd;
#pragma unroll
        for (int kk = 0; kk < kBK; kk += 16) {
            FragB g0, g1, u0, u1;
            load_b2(g0, g1, g + kk, kLd);
            load_b2(u0, u1, u + kk, kLd);
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                FragA fa;
                load_a(fa, a + i * 16 * kLd + kk, kLd);
                mma_bf16(gate[i][0], fa, g0);
                mma_bf16(gate[i][1], fa, g1);
                mma_bf16(up[i][0], fa, u0);
                mma_bf16(up[i][1], fa, u1);
            }
        }
    };
    pipeline(p.d, issue, consume);
    bf16* h = static_cast<bf16*>(p.h);
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
            for (int half = 0; half < 2; ++half) {  // fragment rows g and g + 8
                const int r = wm * 64 + i * 16 + c_row(2 * half);
                if (r >= t.rows)
                    continue;
                float v[2];
#pragma unroll
                for (int c = 0; c < 2; ++c) {
                    const float gv = gate[i][j].x[2 * half + c], uv = up[i][j].x[2 * half + c];
                    v[c] = gv / (1.0f + expf(-gv)) * uv;
                }
                const int col = n0 + wn * 16 + j * 8 + c_col(2 * half);
                *reinterpret_cast<uint32_t*>(h + static_cast<int64_t>(t.row0 + r) * p.inter + col) =
                    pack_bf16(v[0], v[1]);
            }
}

__global__ void __launch_bounds__(kThreads, 1)
    moe_down_kernel(const MoeDispatch d, const MoeExpertParams p) {
    extern __shared__ __align__(16) unsigned char smem[];
    RowTile t;
    if (!find_tile(d, blockIdx.x, t))
        return;
    const int n0 = blockIdx.y * kDownCols, tid = threadIdx.x, warp = tid >> 5;
    const int wm = warp / 4, wn = warp % 4;     // rows wm·64.., columns wn·32..
    bf16* a_s = reinterpret_cast<bf16*>(smem);  // [stages][128][kLd]
    bf16* b_s = a_s + kStages * kBM * kLd;      // [stages][128][kLd] W2 rows
    const bf16* h = static_cast<const bf16*>(p.h);
    const bf16* w2 =
        static_cast<const bf16*>(p.w2) + (static_cast<int64_t>(t.expert) * p.d + n0) * p.inter;
    const int row0 = tid / 4, row1 = row0 + 64, part = tid % 4;
    const bf16* h0 = h + static_cast<int64_t>(t.row0 + (row0 < t.rows ? row0 : 0)) * p.inter;
    const bf16* h1 = h + static_cast<int64_t>(t.row0 + (row1 < t.rows ? row1 : 0)) * p.inter;
    auto issue = [&](int s, int k0) {
        bf16* a = a_s + s * kBM * kLd;
        load_chunk(a, row0, part, h0 + k0 + part * 8, row0 < t.rows);
        load_chunk(a, row1, part, h1 + k0 + part * 8, row1 < t.rows);
        bf16* b = b_s + s * kDownCols * kLd;
        load_chunk(b, row0, part, w2 + static_cast<int64_t>(row0) * p.inter + k0 + part * 8, true);
        load_chunk(b, row1, part, w2 + static_cast<int64_t>(row1) * p.inter + k0 + part * 8, true);
    };
    FragC acc[4][4];  // [m16 tile][n8 tile]
    auto consume = [&](int s) {
        const bf16* a = a_s + s * kBM * kLd + wm * 64 * kLd;
        const bf16* b = b_s + s * kDownCols * kLd + wn * 32 * kLd;
#pragma unroll
        for (int kk = 0; kk < kBK; kk += 16) {
            FragB fb[4];
            load_b2(fb[0], fb[1], b + kk, kLd);
            load_b2(fb[2], fb[3], b + 16 * kLd + kk, kLd);
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                FragA fa;
                load_a(fa, a + i * 16 * kLd + kk, kLd);
#pragma unroll
                for (int j = 0; j < 4; ++j)
                    mma_bf16(acc[i][j], fa, fb[j]);
            }
        }
    };
    pipeline(p.inter, issue, consume);
    bf16* out = static_cast<bf16*>(p.out);
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int r = wm * 64 + i * 16 + c_row(2 * half);
                if (r >= t.rows)
                    continue;
                const int col = n0 + wn * 32 + j * 8 + c_col(2 * half);
                *reinterpret_cast<uint32_t*>(out + static_cast<int64_t>(t.row0 + r) * p.d + col) =
                    pack_bf16(acc[i][j].x[2 * half], acc[i][j].x[2 * half + 1]);
            }
}

// y[t, c..c+1] (+)= Σ_i weight[t, i] · out[row_of[t, i], c..c+1] in slot order.
template <class T>
__global__ void combine_kernel(
    const MoeDispatch d, const bf16* out, const float* weight, int dim, T* y, bool accumulate) {
    const int half = dim / 2;
    const int64_t n = static_cast<int64_t>(d.n_tok) * half;
    for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < n;
         j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t t = j / half, c = 2 * (j % half);
        float s0 = accumulate ? load(y, t * dim + c) : 0.0f;
        float s1 = accumulate ? load(y, t * dim + c + 1) : 0.0f;
        for (int i = 0; i < d.top_k; ++i) {
            const int64_t a = t * d.top_k + i;
            const int r = d.row_of[a];
            if (r < 0)
                continue;
            const float w = weight[a];
            const __nv_bfloat162 v =
                *reinterpret_cast<const __nv_bfloat162*>(out + static_cast<int64_t>(r) * dim + c);
            s0 += w * __low2float(v);
            s1 += w * __high2float(v);
        }
        store(y, t * dim + c, s0);
        store(y, t * dim + c + 1, s1);
    }
}

}  // namespace

void moe_experts(const Stream& s,
                 const MoePlan& plan,
                 const MoeDispatch& d,
                 const MoeExpertParams& p) {
    HYMOE_CHECK(plan.supported && p.d == plan.down_col_tiles * kDownCols &&
                    p.inter == plan.up_col_tiles * kUpCols,
                "moe_experts: d ",
                p.d,
                " inter ",
                p.inter,
                " against the plan's ",
                plan.down_col_tiles * kDownCols,
                " and ",
                plan.up_col_tiles * kUpCols);
    HYMOE_CHECK(plan.n_assign == 0 || (p.x && p.w1 && p.w3 && p.w2 && p.h && p.out),
                "moe_experts: missing array");
    if (plan.n_assign == 0)
        return;
    HYMOE_CHECK(plan.row_tiles <= INT32_MAX, "moe_experts: ", plan.row_tiles, " row tiles");
    const int up_smem = kStages * (kBM + 2 * kUpCols) * kLd * static_cast<int>(sizeof(bf16));
    const int down_smem = kStages * (kBM + kDownCols) * kLd * static_cast<int>(sizeof(bf16));
    allow_dynamic_smem<moe_up_kernel>("moe_experts up");
    allow_dynamic_smem<moe_down_kernel>("moe_experts down");
    const auto row_tiles = static_cast<unsigned>(plan.row_tiles);
    moe_up_kernel<<<dim3(row_tiles, static_cast<unsigned>(plan.up_col_tiles)),
                    kThreads,
                    up_smem,
                    s.get()>>>(d, p);
    check_launch("moe_experts up");
    moe_down_kernel<<<dim3(row_tiles, static_cast<unsigned>(plan.down_col_tiles)),
                      kThreads,
                      down_smem,
                      s.get()>>>(d, p);
    check_launch("moe_experts down");
}

void moe_combine(const Stream& s,
                 const MoeDispatch& d,
                 const void* out,
                 const float* weight,
                 int dim,
                 DType y_dtype,
                 void* y,
                 bool accumulate) {
    HYMOE_CHECK(dim > 0 && dim % 2 == 0 && (y_dtype == DType::f32 || y_dtype == DType::bf16),
                "moe_combine: width ",
                dim,
                " y ",
                to_string(y_dtype));
    HYMOE_CHECK(d.n_tok == 0 || (out && weight && y && d.row_of), "moe_combine: missing array");
    if (d.n_tok == 0)
        return;
    const int64_t n = static_cast<int64_t>(d.n_tok) * (dim / 2);
    dispatch(y_dtype, [&](auto tag) {
        using T = decltype(tag);
        combine_kernel<T><<<grid_for(n, kBlock), kBlock, 0, s.get()>>>(
            d, static_cast<const bf16*>(out), weight, dim, static_cast<T*>(y), accumulate);
    });
    check_launch("moe_combine");
}

}  // namespace hymoe::backend::cuda
