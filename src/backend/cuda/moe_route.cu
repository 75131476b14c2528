// MoE routing and the dispatch plan on the device (hymoe/backend/cuda_fused.h).
// moe_route: one warp per token, with its E scores and choice scores in shared memory: σ or
// softmax (summed in double, as ops::softmax_rows), s' = s + b, group scores (top-2 s' with a
// bias, best s' without) and topk_group kept groups (ties to the smaller group), top_k rounds of
// a warp argmax (ties to the smaller expert), then lane 0 gathers and renormalises the weights
// in slot order: model::route's arithmetic (src/model/router.cpp), dropless.
// moe_dispatch_plan: a stable counting sort of the n_tok·top_k assignments by expert in three
// launches (no host round trip): per-block expert counts, one block scanning them into each
// expert's first row and first GEMM row tile (and each block's first row per expert), then each
// block ranks its assignments (warp match + per-warp counts) into rows. Expert e's rows hold its
// assignments in token order, as model/moe.cpp's plan_dispatch.
#include <cmath>

#include "hymoe/backend/cuda_fused.h"
#include "kernels.h"
#include "smem_limit.cuh"

namespace hymoe::backend::cuda {

namespace {

constexpr int kRouteWarps = 8;
constexpr int kMaxTopK = 32;
constexpr int kMaxGroups = 32;
constexpr int kScanThreads = 1024;

// (v, e) beats (w, f): larger score, or equal and the smaller index.
__device__ inline bool better(float v, int e, float w, int f) {
    return v > w || (v == w && e < f);
}

// The warp's best (v, e) over the lanes' candidates, returned to every lane.
__device__ inline void warp_argmax(float& v, int& e) {
    for (int o = 16; o > 0; o >>= 1) {
        const float w = __shfl_xor_sync(0xffffffffu, v, o);
        const int f = __shfl_xor_sync(0xffffffffu, e, o);
        if (better(w, f, v, e)) {
            v = w;
            e = f;
        }
    }
}

__global__ void __launch_bounds__(kRouteWarps * 32) moe_route_kernel(const MoeRouteParams p) {
    extern __shared__ __align__(16) unsigned char smem[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, E = p.n_exp;
    const int64_t t = static_cast<int64_t>(blockIdx.x) * kRouteWarps + warp;
    if (t >= p.n_tok)
        return;
    float* s = reinterpret_cast<float*>(smem) + warp * 2 * E;  // [E] scores
    float* choice = s + E;                                     // [E] s', masked groups filled
    __shared__ int selected[kRouteWarps][kMaxTopK];
    const float* x = p.logits + t * E;
    if (p.softmax) {
        float mx = -INFINITY;
        for (int e = lane; e < E; e += 32)
            mx = fmaxf(mx, x[e]);
        for (int o = 16; o > 0; o >>= 1)
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        double sum = 0.0;
        for (int e = lane; e < E; e += 32) {
            s[e] = expf(x[e] - mx);
            sum += static_cast<double>(s[e]);
        }
        for (int o = 16; o > 0; o >>= 1)
            sum += __shfl_xor_sync(0xffffffffu, sum, o);
        const float inv = static_cast<float>(1.0 / sum);
        for (int e = lane; e < E; e += 32)
            s[e] *= inv;
    } else {
        for (int e = lane; e < E; e += 32)
            s[e] = 1.0f / (1.0f + expf(-x[e]));
    }
    for (int e = lane; e < E; e += 32)
        choice[e] = p.bias ? s[e] + p.bias[e] : s[e];
    __syncwarp();
    if (p.n_group > 1) {
        const int per = E / p.n_group;
        float score = -INFINITY;  // lane g < n_group: its group's score
        if (lane < p.n_group) {
            float best = -INFINITY, second = -INFINITY;
            for (int i = 0; i < per; ++i) {
                const float v = choice[lane * per + i];
                if (v > best) {
                    second = best;
                    best = v;
                } else if (v > second) {
                    second = v;
                }
            }
            score = p.bias ? best + second : best;
        }
        bool kept = false;
        for (int r = 0; r < p.topk_group; ++r) {
            float v = lane < p.n_group && !kept ? score : -INFINITY;
            int g = lane < p.n_group && !kept ? lane : kMaxGroups;
            warp_argmax(v, g);
            kept = kept || lane == g;
        }
        const unsigned keep = __ballot_sync(0xffffffffu, kept);
        for (int e = lane; e < E; e += 32)
            if (!((keep >> (e / per)) & 1u))
                choice[e] = p.group_fill;
        __syncwarp();
    }
    unsigned taken = 0;  // bit j: expert lane + 32·j chosen
    for (int i = 0; i < p.top_k; ++i) {
        float v = -INFINITY;
        int best = E;
        for (int j = 0, e = lane; e < E; ++j, e += 32)
            if (!((taken >> j) & 1u) && better(choice[e], e, v, best)) {
                v = choice[e];
                best = e;
            }
        warp_argmax(v, best);
        if ((best & 31) == lane)
            taken |= 1u << (best >> 5);
        if (lane == 0)
            selected[warp][i] = best;
    }
    __syncwarp();
    if (lane == 0) {
        float w[kMaxTopK];
        float sum = 0.0f;
        for (int i = 0; i < p.top_k; ++i) {
            const int e = selected[warp][i];
            w[i] = p.weights_from_biased && p.bias ? s[e] + p.bias[e] : s[e];
            sum += w[i];
        }
        for (int i = 0; i < p.top_k; ++i) {
            if (p.renormalize)
                w[i] /= sum + p.renorm_eps;
            w[i] *= p.scale;
            p.idx[t * p.top_k + i] = selected[warp][i];
            p.weight[t * p.top_k + i] = w[i];
        }
    }
}

// Block b: counts[b, e] = assignments of block b's kMoeRankTile going to expert e.
__global__ void __launch_bounds__(kMoeRankTile)
    count_kernel(const int32_t* idx, int64_t n_assign, MoeDispatch d) {
    extern __shared__ int hist[];  // [E]
    for (int e = threadIdx.x; e < d.n_exp; e += blockDim.x)
        hist[e] = 0;
    __syncthreads();
    const int64_t a = static_cast<int64_t>(blockIdx.x) * kMoeRankTile + threadIdx.x;
    if (a < n_assign && idx[a] >= 0)
        atomicAdd(&hist[idx[a]], 1);
    __syncthreads();
    for (int e = threadIdx.x; e < d.n_exp; e += blockDim.x)
        d.tile_counts[static_cast<int64_t>(blockIdx.x) * d.n_exp + e] = hist[e];
}

// One block: offset and tile_start by exclusive scans over the experts; tile_counts[b, e] becomes
// the first row of block b's assignments of expert e.
__global__ void __launch_bounds__(kScanThreads) scan_kernel(int n_tiles, MoeDispatch d) {
    __shared__ int rows[kScanThreads], tiles[kScanThreads];
    const int e = threadIdx.x, E = d.n_exp;
    int total = 0;
    if (e < E)
        for (int b = 0; b < n_tiles; ++b)
            total += d.tile_counts[static_cast<int64_t>(b) * E + e];
    rows[e] = e < E ? total : 0;
    tiles[e] = e < E ? (total + kMoeTileRows - 1) / kMoeTileRows : 0;
    __syncthreads();
    for (int o = 1; o < kScanThreads; o <<= 1) {  // inclusive Hillis-Steele scans
        const int r = e >= o ? rows[e - o] : 0, t = e >= o ? tiles[e - o] : 0;
        __syncthreads();
        rows[e] += r;
        tiles[e] += t;
        __syncthreads();
    }
    if (e < E) {
        const int first = rows[e] - total;
        d.offset[e] = first;
        d.tile_start[e] = tiles[e] - (total + kMoeTileRows - 1) / kMoeTileRows;
        if (e == E - 1) {
            d.offset[E] = rows[e];
            d.tile_start[E] = tiles[e];
        }
        int running = first;
        for (int b = 0; b < n_tiles; ++b) {
            int* c = d.tile_counts + static_cast<int64_t>(b) * E + e;
            const int n = *c;
            *c = running;
            running += n;
        }
    }
}

// Block b ranks its assignments: row = first row of (b, e) + those of e in earlier warps + those
// of e in earlier lanes of this warp.
__global__ void __launch_bounds__(kMoeRankTile)
    rank_kernel(const int32_t* idx, int64_t n_assign, MoeDispatch d) {
    extern __shared__ int warp_count[];  // [kMoeRankTile / 32, E]
    constexpr int kWarps = kMoeRankTile / 32;
    const int E = d.n_exp, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int i = threadIdx.x; i < kWarps * E; i += blockDim.x)
        warp_count[i] = 0;
    __syncthreads();
    const int64_t a = static_cast<int64_t>(blockIdx.x) * kMoeRankTile + threadIdx.x;
    const int e = a < n_assign ? idx[a] : -1;
    const unsigned peers = __match_any_sync(0xffffffffu, e);
    const int rank = __popc(peers & ((1u << lane) - 1u));
    if (e >= 0 && rank == 0)
        warp_count[warp * E + e] = __popc(peers);
    __syncthreads();
    if (a >= n_assign)
        return;
    if (e < 0) {
        d.row_of[a] = -1;
        return;
    }
    int row = d.tile_counts[static_cast<int64_t>(blockIdx.x) * E + e] + rank;
    for (int w = 0; w < warp; ++w)
        row += warp_count[w * E + e];
    d.row_of[a] = row;
    d.token_of[row] = static_cast<int32_t>(a / d.top_k);
}

}  // namespace

void moe_route(const Stream& s, const MoeRouteParams& p) {
    HYMOE_CHECK(p.n_tok >= 0 && p.n_exp >= 1 && p.n_exp <= 1024 && p.top_k >= 1 &&
                    p.top_k <= kMaxTopK && p.top_k <= p.n_exp && p.n_group >= 1 &&
                    p.n_group <= kMaxGroups && p.n_exp % p.n_group == 0 && p.topk_group >= 1 &&
                    p.topk_group <= p.n_group,
                "moe_route: E ",
                p.n_exp,
                " top_k ",
                p.top_k,
                " groups ",
                p.n_group,
                " kept ",
                p.topk_group,
                " (E ≤ 1024, top_k ≤ 32, groups ≤ 32)");
    HYMOE_CHECK(p.n_tok == 0 || (p.logits && p.idx && p.weight), "moe_route: missing array");
    if (p.n_tok == 0)
        return;
    const int smem = kRouteWarps * 2 * p.n_exp * static_cast<int>(sizeof(float));
    allow_dynamic_smem<moe_route_kernel>("moe_route");
    const auto blocks = static_cast<unsigned>((p.n_tok + kRouteWarps - 1) / kRouteWarps);
    moe_route_kernel<<<blocks, kRouteWarps * 32, smem, s.get()>>>(p);
    check_launch("moe_route");
}

void moe_dispatch_plan(const Stream& s,
                       const MoePlan& plan,
                       const int32_t* idx,
                       const MoeDispatch& d) {
    HYMOE_CHECK(plan.supported && d.n_exp >= 1 && d.n_exp <= kScanThreads &&
                    int64_t{d.n_tok} * d.top_k == plan.n_assign,
                "moe_dispatch_plan: ",
                d.n_tok,
                " tokens × ",
                d.top_k,
                " against a plan of ",
                plan.n_assign,
                " assignments");
    if (plan.n_assign == 0) {
        HYMOE_CUDA_CHECK(cudaMemsetAsync(d.offset, 0, sizeof(int32_t) * (d.n_exp + 1), s.get()),
                         "moe_dispatch_plan: offsets");
        HYMOE_CUDA_CHECK(cudaMemsetAsync(d.tile_start, 0, sizeof(int32_t) * (d.n_exp + 1), s.get()),
                         "moe_dispatch_plan: tile starts");
        return;
    }
    const auto tiles = static_cast<unsigned>(plan.rank_tiles);
    count_kernel<<<tiles, kMoeRankTile, d.n_exp * sizeof(int), s.get()>>>(idx, plan.n_assign, d);
    check_launch("moe_dispatch_plan counts");
    scan_kernel<<<1, kScanThreads, 0, s.get()>>>(plan.rank_tiles, d);
    check_launch("moe_dispatch_plan scan");
    const int rank_smem = kMoeRankTile / 32 * d.n_exp * static_cast<int>(sizeof(int));
    rank_kernel<<<tiles, kMoeRankTile, rank_smem, s.get()>>>(idx, plan.n_assign, d);
    check_launch("moe_dispatch_plan ranks");
}

}  // namespace hymoe::backend::cuda
