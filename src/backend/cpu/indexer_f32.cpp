// The fused fp32 AVX-512 kernels of the DSA indexer's scores (backend/cpu/indexer_kernels.h),
// spec/model-math.md §5: I(t, s) = Σ_j w_t,j · ReLU(q^I_t,j · k^I_s), the scale already in w.
// Two forms of one order of reduction, picked by the query count:
// - by tiles (3 queries or more: prefill): keys [n_k, d] packed a chunk at a time into tiles of
//   16 keys ([d][16], a key per lane, in an L2-sized buffer, read from memory once per block of
//   queries); per query a register tile of 8 heads × 3 key tiles (24 accumulators) runs over d,
//   the head's query element broadcast; the ReLU and head weight fold into a score vector per tile.
// - by rows (1 or 2 queries: decode): no packing; the query transposed to a head per lane, 16
//   accumulators (one per key) run over d with the key's element broadcast from its row, so the
//   keys stream from memory once, prefetched ahead; the ReLU'd, weighted products of 16 keys are
//   transposed in registers to a vector per head and added in head order.
// Order of reduction, the one of ops::gemm's AVX-512 GEMM followed by the separate ReLU/weight
// pass (so the bits of the GEMM path, for d ≤ 256): per head j and key s the dot product q_j · k_s
// is one fused multiply-add chain over the dims in order from 0, starting at 0; the score starts
// at +0 and adds round(w_j · ReLU(dot_j)) over the heads in order (a multiply then an add, not
// fused). No key's score depends on the form, its lane, tile, chunk or the other queries (equal
// keys score equal: the top-k's ties stay ties), nor on the OpenMP thread count (threads split
// query blocks or key chunks). Compiled with -mavx512f -mavx512bw -mavx512vl -fopenmp; callers
// check detail::f32_avx512_on() first. g++ 12's AVX-512 headers start vectors as
// `__Y = __Y`, which -Wuninitialized reports at every inlined use: silenced here.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <algorithm>
#include <immintrin.h>
#include <vector>

#include "avx512_transpose.h"
#include "indexer_kernels.h"

namespace hymoe::ops::detail {

namespace {

constexpr int64_t kTile = 16;        // keys per tile: one vector lane each
constexpr int64_t kTileBlock = 3;    // key tiles of one register tile
constexpr int64_t kChunkKeys = 384;  // keys packed per chunk: 96 KiB at d 64, in L2
constexpr int64_t kQueryBlockFloats = int64_t{1} << 16;  // q floats of a block of queries
constexpr int64_t kMinParallelMacs = int64_t{1} << 22;   // smaller calls stay on one thread
constexpr int64_t kRowsMaxQueries = 2;  // the rows form up to here (measured crossover: 3)
constexpr int64_t kRowsAhead = 64;      // keys prefetched ahead of the rows form's block
constexpr int nearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

struct alignas(64) Line {
    float v[16];
};

__mmask16 first_lanes(int64_t n) {  // lanes [0, n) of 16
    return n >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << n) - 1);
}

// Prefetches the floats [p, p + n) into L2.
void prefetch_l2(const float* p, int64_t n) {
    for (int64_t i = 0; i < n; i += 16)
        _mm_prefetch(reinterpret_cast<const char*>(p + i), _MM_HINT_T1);
}

// dst [⌈n/16⌉][d][16] = the keys k [n, d] (row stride d) by tiles, lane l of tile t key 16t + l
// (zero past n): 16 × 16 blocks loaded by rows and transposed in registers.
void pack_keys(const float* k, int64_t d, int64_t n, float* dst) {
    for (int64_t t = 0; t * kTile < n; ++t) {
        const int64_t rows = std::min(kTile, n - t * kTile);
        const float* src = k + t * kTile * d;
        float* out = dst + t * d * kTile;
        for (int64_t e0 = 0; e0 < d; e0 += 16) {
            const int64_t cols = std::min<int64_t>(16, d - e0);
            const __mmask16 mc = first_lanes(cols);
            __m512 r[16];
#pragma GCC unroll 16
            for (int i = 0; i < 16; ++i)
                r[i] = i < rows ? _mm512_maskz_loadu_ps(mc, src + i * d + e0) : _mm512_setzero_ps();
            transpose16(r);
#pragma GCC unroll 16
            for (int c = 0; c < 16; ++c)
                if (c < cols)
                    _mm512_store_ps(out + (e0 + c) * kTile, r[c]);
        }
    }
}

// score[t] += Σ_{h<HB} round(w[h] · ReLU(q_h · keys of tile t)) in head order, for the TB tiles
// at tiles (tile stride d·16) and the heads q [HB, d].
template <int HB, int TB>
void head_group(const float* q, const float* w, int64_t d, const float* tiles, __m512* score) {
    __m512 acc[HB][TB];
#pragma GCC unroll 8
    for (int h = 0; h < HB; ++h)
#pragma GCC unroll 3
        for (int t = 0; t < TB; ++t)
            acc[h][t] = _mm512_setzero_ps();
    for (int64_t e = 0; e < d; ++e) {
        __m512 kv[TB];
#pragma GCC unroll 3
        for (int t = 0; t < TB; ++t)
            kv[t] = _mm512_load_ps(tiles + (t * d + e) * kTile);
#pragma GCC unroll 8
        for (int h = 0; h < HB; ++h) {
            const __m512 qb = _mm512_set1_ps(q[h * d + e]);
#pragma GCC unroll 3
            for (int t = 0; t < TB; ++t)
                acc[h][t] = _mm512_fmadd_ps(qb, kv[t], acc[h][t]);
        }
    }
    const __m512 zero = _mm512_setzero_ps();
    // the product by an explicit-rounding multiply, which g++ does not contract with the add into
    // a fused multiply-add (it does _mm512_mul_ps, a plain vector `*`); max(0, x) keeps a NaN as
    // std::max(x, 0) does
#pragma GCC unroll 8
    for (int h = 0; h < HB; ++h) {
        const __m512 wh = _mm512_set1_ps(w[h]);
#pragma GCC unroll 3
        for (int t = 0; t < TB; ++t)
            score[t] = _mm512_add_ps(
                score[t], _mm512_mul_round_ps(wh, _mm512_max_ps(zero, acc[h][t]), nearest));
    }
}

// out [n] = the scores of one query (q [n_head, d], w [n_head]) over the n ≤ 16·TB keys of the TB
// tiles at tiles.
template <int TB>
void key_tiles(const float* q,
               const float* w,
               int64_t n_head,
               int64_t d,
               const float* tiles,
               float* out,
               int64_t n) {
    __m512 score[TB];
#pragma GCC unroll 3
    for (int t = 0; t < TB; ++t)
        score[t] = _mm512_setzero_ps();
    int64_t j = 0;
    for (; j + 8 <= n_head; j += 8)
        head_group<8, TB>(q + j * d, w + j, d, tiles, score);
    if (n_head - j >= 4) {
        head_group<4, TB>(q + j * d, w + j, d, tiles, score);
        j += 4;
    }
    if (n_head - j >= 2) {
        head_group<2, TB>(q + j * d, w + j, d, tiles, score);
        j += 2;
    }
    if (n_head - j == 1)
        head_group<1, TB>(q + j * d, w + j, d, tiles, score);
#pragma GCC unroll 3
    for (int t = 0; t < TB; ++t)
        _mm512_mask_storeu_ps(out + kTile * t, first_lanes(n - kTile * t), score[t]);
}

// The scores of the queries [i0, i1) by tiles (q, w, k, scores as indexer_scores_f32_avx512):
// every chunk of keys packed, then each query's register tiles over it.
void tiles_block(const float* q,
                 const float* w,
                 int64_t i0,
                 int64_t i1,
                 int64_t n_head,
                 int64_t d,
                 const float* k,
                 int64_t n_k,
                 float* scores,
                 int64_t ld_s) {
    thread_local std::vector<Line> buf;  // [chunk tiles][d][16], kept across calls
    const auto lines = static_cast<size_t>(kChunkKeys / kTile * d);
    if (buf.size() < lines)
        buf.resize(lines);
    float* tiles = buf.data()->v;
    for (int64_t s0 = 0; s0 < n_k; s0 += kChunkKeys) {
        const int64_t n_c = std::min(kChunkKeys, n_k - s0);
        pack_keys(k + s0 * d, d, n_c, tiles);
        for (int64_t i = i0; i < i1; ++i) {
            const float* qi = q + i * n_head * d;
            const float* wi = w + i * n_head;
            float* si = scores + i * ld_s + s0;
            int64_t c = 0;  // first key of the register tile (its tile at c·d floats)
            for (; c + kTileBlock * kTile <= n_c; c += kTileBlock * kTile) {
                const int64_t ahead = s0 + kChunkKeys + c;  // the next chunk's keys to L2
                if (i == i0 && ahead < n_k)                 // while this chunk runs
                    prefetch_l2(k + ahead * d, std::min(kTileBlock * kTile, n_k - ahead) * d);
                key_tiles<3>(qi, wi, n_head, d, tiles + c * d, si + c, kTileBlock * kTile);
            }
            if (n_c - c > 2 * kTile)
                key_tiles<3>(qi, wi, n_head, d, tiles + c * d, si + c, n_c - c);
            else if (n_c - c > kTile)
                key_tiles<2>(qi, wi, n_head, d, tiles + c * d, si + c, n_c - c);
            else if (n_c > c)
                key_tiles<1>(qi, wi, n_head, d, tiles + c * d, si + c, n_c - c);
        }
    }
}

// scores [n_q, n_k] by tiles: the queries by blocks that stay in L2 (256 KiB of q) while every
// chunk of keys passes, the blocks split over the OpenMP threads (each packs keys for itself).
void scores_by_tiles(const float* q,
                     const float* w,
                     int64_t n_q,
                     int64_t n_head,
                     int64_t d,
                     const float* k,
                     int64_t n_k,
                     float* scores,
                     int64_t ld_s) {
    const bool parallel = n_q * n_k * n_head * d >= kMinParallelMacs;
    const int64_t q_block = std::clamp<int64_t>(  // at least 8 blocks for the threads to share
        parallel ? (n_q + 7) / 8 : n_q,
        1,
        std::max<int64_t>(1, kQueryBlockFloats / (n_head * d)));
    const int64_t n_blocks = (n_q + q_block - 1) / q_block;
#pragma omp parallel for schedule(static) if (parallel)
    for (int64_t b = 0; b < n_blocks; ++b)
        tiles_block(
            q, w, b * q_block, std::min(n_q, (b + 1) * q_block), n_head, d, k, n_k, scores, ld_s);
}

// qt [⌈n_head/16⌉][d][16] = one query's q [n_head, d] by groups of 16 heads, lane l of group g
// head 16g + l; wt [⌈n_head/16⌉·16] = its w; both zero past n_head.
void heads_in_lanes(
    const float* q, const float* w, int64_t n_head, int64_t d, float* qt, float* wt) {
    const int64_t groups = (n_head + 15) / 16;
    std::fill(qt, qt + groups * d * 16, 0.0f);
    std::fill(wt, wt + groups * 16, 0.0f);
    for (int64_t j = 0; j < n_head; ++j) {
        wt[j] = w[j];
        for (int64_t e = 0; e < d; ++e)
            qt[((j / 16) * d + e) * 16 + j % 16] = q[j * d + e];
    }
}

// out [n] = one query's scores (qt, wt from heads_in_lanes) over the 16 key rows k [16, d], the
// first n stored: per group of 16 heads one accumulator per key (a head per lane) over d, then
// w · ReLU, transposed to a vector (over the keys) per head, added in head order.
void row_block(const float* qt,
               const float* wt,
               int64_t n_head,
               int64_t d,
               const float* k,
               float* out,
               int64_t n) {
    const __m512 zero = _mm512_setzero_ps();
    __m512 score = zero;
    for (int64_t g = 0; g * 16 < n_head; ++g) {
        const float* qg = qt + g * d * 16;
        __m512 acc[16];
#pragma GCC unroll 16
        for (int s = 0; s < 16; ++s)
            acc[s] = zero;
        for (int64_t e = 0; e < d; ++e) {
            const __m512 qv = _mm512_load_ps(qg + e * 16);
#pragma GCC unroll 16
            for (int s = 0; s < 16; ++s)
                acc[s] = _mm512_fmadd_ps(_mm512_set1_ps(k[s * d + e]), qv, acc[s]);
        }
        const __m512 wg = _mm512_load_ps(wt + g * 16);
#pragma GCC unroll 16
        for (int s = 0; s < 16; ++s)  // as in head_group: no contraction, NaN kept
            acc[s] = _mm512_mul_round_ps(wg, _mm512_max_ps(zero, acc[s]), nearest);
        transpose16(acc);  // acc[j]: head 16g + j over the 16 keys
        const int64_t heads = std::min<int64_t>(16, n_head - g * 16);
#pragma GCC unroll 16
        for (int j = 0; j < 16; ++j)
            if (j < heads)
                score = _mm512_add_ps(score, acc[j]);
    }
    _mm512_mask_storeu_ps(out, first_lanes(n), score);
}

// scores [n_q, n_k] by rows (q, w, k as indexer_scores_f32_avx512), the chunks of keys split
// over the OpenMP threads; the last n_k mod 16 keys from a zero-padded copy.
void scores_by_rows(const float* q,
                    const float* w,
                    int64_t n_q,
                    int64_t n_head,
                    int64_t d,
                    const float* k,
                    int64_t n_k,
                    float* scores,
                    int64_t ld_s) {
    thread_local std::vector<Line> qbuf, tail;  // [n_q][groups][d + 1][16], [16][d]
    const int64_t per_query = (n_head + 15) / 16 * (d + 1) * 16;
    qbuf.resize(static_cast<size_t>(n_q * per_query / 16));
    tail.resize(static_cast<size_t>(d));
    float* qt = qbuf.data()->v;
    for (int64_t i = 0; i < n_q; ++i)
        heads_in_lanes(q + i * n_head * d,
                       w + i * n_head,
                       n_head,
                       d,
                       qt + i * per_query,
                       qt + i * per_query + (n_head + 15) / 16 * d * 16);
    const int64_t full = n_k / 16 * 16;
    std::fill(tail.data()->v, tail.data()->v + 16 * d, 0.0f);
    std::copy(k + full * d, k + n_k * d, tail.data()->v);
    const float* last = tail.data()->v;  // this thread's copy, for every thread below
    const int64_t n_chunks = (n_k + kChunkKeys - 1) / kChunkKeys;
#pragma omp parallel for schedule(static) if (n_q * n_k * n_head * d >= kMinParallelMacs)
    for (int64_t s0 = 0; s0 < n_chunks * kChunkKeys; s0 += kChunkKeys)
        for (int64_t i = 0; i < n_q; ++i) {
            const float* qi = qt + i * per_query;
            const float* wi = qi + (n_head + 15) / 16 * d * 16;
            for (int64_t c = s0; c < std::min(n_k, s0 + kChunkKeys); c += 16) {
                if (i == 0 && c + kRowsAhead < n_k)
                    prefetch_l2(k + (c + kRowsAhead) * d,
                                std::min<int64_t>(16, n_k - c - kRowsAhead) * d);
                row_block(qi,
                          wi,
                          n_head,
                          d,
                          c < full ? k + c * d : last,
                          scores + i * ld_s + c,
                          std::min<int64_t>(16, n_k - c));
            }
        }
}

}  // namespace

void indexer_scores_f32_avx512(const float* q,
                               const float* w,
                               int64_t n_q,
                               int64_t n_head,
                               int64_t d,
                               const float* k,
                               int64_t n_k,
                               float* scores,
                               int64_t ld_s) {
    if (n_q <= kRowsMaxQueries)
        scores_by_rows(q, w, n_q, n_head, d, k, n_k, scores, ld_s);
    else
        scores_by_tiles(q, w, n_q, n_head, d, k, n_k, scores, ld_s);
}

}  // namespace hymoe::ops::detail
