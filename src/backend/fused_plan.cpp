// The fused kernels' plans (hymoe/backend/cuda_fused.h): shared-memory layouts, tiles, split
// counts and grid bounds, in plain C++ so that every build unit-tests them on the CPU
// (tests/unit/backend/test_fused_plan.cpp). The kernels read their offsets from these structs.
#include <algorithm>
#include <cstdint>

#include "hymoe/backend/cuda_fused.h"

namespace hymoe::backend::cuda {

namespace {

constexpr int kAlign = 16;  // ldmatrix rows, float4 and cp.async all need 16-byte alignment

int align_up(int64_t x, int64_t a) {
    return static_cast<int>((x + a - 1) / a * a);
}

// Hands out aligned byte ranges one after another.
struct Bump {
    int at = 0;
    int take(int64_t bytes) {
        const int off = align_up(at, kAlign);
        at = static_cast<int>(off + bytes);
        return off;
    }
};

int next_pow2(int64_t x) {
    int p = 1;
    while (p < x)
        p <<= 1;
    return p;
}

}  // namespace

KdaChunkLayout kda_chunk_layout(int d_k, int d_v) {
    KdaChunkLayout L;
    L.d_k = d_k;
    if (d_k < 16 || d_k > 128 || d_k % 16 != 0) {
        L.why = "d_k must be a multiple of 16 up to 128";
        return L;
    }
    if (d_v < 32 || d_v % 32 != 0) {
        L.why = "d_v must be a multiple of 32";
        return L;
    }
    const int C = kKdaChunk, K = d_k;
    L.bv = d_v % 64 == 0 ? 64 : 32;
    L.ld_k = K + 8;
    L.ld_c = C + 8;
    L.ld_v = L.bv + 8;
    L.ld_cf = C + 4;
    L.ld_s = L.bv + 4;
    const int64_t tile_k = int64_t{C} * L.ld_k * 2;  // one bf16 [C, K] tile
    // region X: the staged inputs, later the solve's and products' tiles
    Bump x;
    L.a32 = x.take(int64_t{C} * K * 4);
    L.q16 = x.take(tile_k);
    L.k16 = x.take(tile_k);
    Bump x2;
    L.t16 = x2.take(int64_t{C} * L.ld_c * 2);
    L.aqk16 = x2.take(int64_t{C} * L.ld_c * 2);
    L.w16 = x2.take(tile_k);
    L.vp16 = x2.take(int64_t{C} * L.ld_v * 2);
    L.v16 = x2.take(int64_t{C} * L.ld_v * 2);
    L.x32 = x2.take(3 * kKdaSub * kKdaSub * 4);
    Bump all;
    all.at = std::max(x.at, x2.at);
    // region Z: the sub-block factors (3·16 + 3·16 + 6·16 = 3·C rows), later the chunk factors
    const int z = all.take(3 * tile_k);
    L.qi16 = z;
    L.ki16 = z + static_cast<int>(int64_t{C - kKdaSub} * L.ld_k * 2);
    L.r16 = z + static_cast<int>(2 * int64_t{C - kKdaSub} * L.ld_k * 2);
    L.qg16 = z;
    L.kg16 = z + static_cast<int>(tile_k);
    L.kl16 = z + static_cast<int>(2 * tile_k);
    L.akk32 = all.take(int64_t{C} * L.ld_cf * 4);
    L.aqk32 = all.take(int64_t{C} * L.ld_cf * 4);
    L.s32 = all.take(int64_t{K} * L.ld_s * 4);
    L.s16 = all.take(int64_t{K} * L.ld_v * 2);
    L.beta = all.take(int64_t{C} * 4);
    L.dec = all.take(int64_t{K} * 4);
    L.bytes = align_up(all.at, kAlign);
    if (L.bytes > kDynamicSmemLimit) {
        L.why = "shared memory over 227 KiB";
        return L;
    }
    L.supported = true;
    return L;
}

IndexerPlan indexer_topk_plan(
    int n_q, int max_visible, int n_head, int d, int top_k, bool one_sequence, int n_sm) {
    IndexerPlan P;
    if (d < 16 || d % 16 != 0 || n_head < 1 || top_k < 1) {
        P.why = "d_I must be a multiple of 16, H_I and top_k positive";
        return P;
    }
    P.queries_per_block = one_sequence && (2 * n_head) % 16 == 0 ? 2 : 1;
    if (P.queries_per_block * n_head % 16 != 0) {
        P.why = "H_I must be a multiple of 16 (8 in a one-sequence launch)";
        return P;
    }
    const int qb = P.queries_per_block, rows = qb * n_head;
    P.n_q = n_q, P.n_head = n_head, P.d = d, P.top_k = top_k;
    P.capacity = next_pow2(int64_t{top_k} + P.key_tile);
    P.ld_q = d + 8;
    P.ld_logit = P.key_tile + 4;
    Bump b;
    P.q_off = b.take(int64_t{rows} * P.ld_q * 2);
    P.k_off = b.take(int64_t{P.key_tile} * P.ld_q * 2);
    P.logit_off = b.take(int64_t{rows} * P.ld_logit * 4);
    P.cand_off = b.take(int64_t{qb} * P.capacity * 8);
    P.w_off = b.take(int64_t{rows} * 4);
    P.smem_bytes = align_up(b.at, kAlign);
    if (P.smem_bytes > kDynamicSmemLimit) {
        P.why = "shared memory over 227 KiB (H_I·d_I or top_k too large)";
        return P;
    }
    // Split each query's keys when the queries alone cannot fill twice the SMs, as long as every
    // split still ranks several times top_k keys and the merge's sort fits in shared memory.
    const int64_t blocks = (int64_t{n_q} + qb - 1) / qb;
    const int64_t want = blocks > 0 ? (2 * int64_t{n_sm} + blocks - 1) / blocks : 1;
    const int64_t by_keys = std::max<int64_t>(1, max_visible / (4 * int64_t{top_k}));
    int64_t split = std::min<int64_t>({want, by_keys, 64});
    while (split > 1 && int64_t{next_pow2(split * top_k)} * 8 > kDynamicSmemLimit)
        --split;
    P.n_split = static_cast<int>(std::max<int64_t>(split, 1));
    if (P.n_split > 1) {
        P.merge_smem_bytes = next_pow2(int64_t{P.n_split} * top_k) * 8;
        P.scratch_bytes = int64_t{n_q} * P.n_split * top_k * 8;
    }
    P.supported = true;
    return P;
}

MlaSparsePlan mla_sparse_plan(int n_head, int r_kv, int d_r) {
    MlaSparsePlan P;
    const int d_lat = r_kv + d_r;
    P.row_blocks = n_head <= 16 ? 1 : 2;
    const int col_splits = 8 / P.row_blocks;  // warps sharing a row block split ō's columns
    if (n_head < 1 || d_lat % 16 != 0 || r_kv % (16 * col_splits) != 0 || r_kv > 128 * col_splits) {
        P.why =
            "r_kv + d_r must be a multiple of 16, r_kv of 128 up to 1024 (of 64 up to 512 above 16 "
            "heads)";
        return P;
    }
    const int rows = 16 * P.row_blocks;
    P.head_tiles = (n_head + rows - 1) / rows;
    P.n_head = n_head, P.r_kv = r_kv, P.d_r = d_r;
    P.ld_lat = d_lat + 8;
    P.ld_score = P.key_tile + 4;
    P.ld_prob = P.key_tile + 8;
    Bump b;
    P.q_off = b.take(int64_t{rows} * P.ld_lat * 2);
    P.k_off = b.take(int64_t{P.key_tile} * P.ld_lat * 2);
    P.score_off = b.take(int64_t{rows} * P.ld_score * 4);
    P.prob_off = b.take(int64_t{rows} * P.ld_prob * 2);
    P.stat_off = b.take(int64_t{3} * rows * 4);
    P.key_off = b.take(int64_t{P.key_tile} * 4);
    P.smem_bytes = align_up(b.at, kAlign);
    if (P.smem_bytes > kDynamicSmemLimit) {
        P.why = "shared memory over 227 KiB (latent row too wide)";
        return P;
    }
    P.supported = true;
    return P;
}

MoePlan moe_plan(int64_t n_tok, int top_k, int n_exp, int d, int inter) {
    MoePlan P;
    if (n_exp < 1 || n_exp > 1024 || top_k < 1 || top_k > n_exp || n_tok < 0) {
        P.why = "need 1 ≤ top_k ≤ E ≤ 1024";
        return P;
    }
    if (d < 128 || d % 128 != 0 || inter < 64 || inter % 64 != 0) {
        P.why = "d must be a multiple of 128 and the expert width of 64";
        return P;
    }
    P.n_assign = n_tok * top_k;
    P.rank_tiles = static_cast<int>((P.n_assign + kMoeRankTile - 1) / kMoeRankTile);
    P.row_tiles =
        (P.n_assign + kMoeTileRows - 1) / kMoeTileRows + std::min<int64_t>(n_exp, P.n_assign);
    P.up_col_tiles = inter / 64;
    P.down_col_tiles = d / 128;
    Bump b;
    b.take(int64_t{P.rank_tiles} * n_exp * 4);
    b.take(int64_t{n_exp + 1} * 4);
    b.take(int64_t{n_exp + 1} * 4);
    b.take(P.n_assign * 4);
    b.take(P.n_assign * 4);
    P.scratch_bytes = align_up(b.at, kAlign);
    P.supported = true;
    return P;
}

MoeDispatch moe_dispatch_arrays(
    const MoePlan& plan, int n_tok, int top_k, int n_exp, void* scratch) {
    MoeDispatch D;
    D.n_tok = n_tok;
    D.top_k = top_k;
    D.n_exp = n_exp;
    char* base = static_cast<char*>(scratch);
    Bump b;
    D.tile_counts = reinterpret_cast<int32_t*>(base + b.take(int64_t{plan.rank_tiles} * n_exp * 4));
    D.offset = reinterpret_cast<int32_t*>(base + b.take(int64_t{n_exp + 1} * 4));
    D.tile_start = reinterpret_cast<int32_t*>(base + b.take(int64_t{n_exp + 1} * 4));
    D.row_of = reinterpret_cast<int32_t*>(base + b.take(plan.n_assign * 4));
    D.token_of = reinterpret_cast<int32_t*>(base + b.take(plan.n_assign * 4));
    return D;
}

}  // namespace hymoe::backend::cuda
