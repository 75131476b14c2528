// The MLA/DSA block's ops over its latent cache (backend/latent_cache.h), model/attention.cpp's
// middle: the new rows' latents appended to the cache, then every new row's attention over its
// sequence's cache (spec/model-math.md §4-5), dense or over the DSA indexer's top-k. CPU
// (backend/cpu/mla_attend.cpp): per sequence in blocks of queries, the expanded (MHA), absorbed
// (MQA over the latent) or sparse (per query over its gathered top-k rows) form. CUDA
// (backend/cuda/mla_attend.cpp): q̂ for every row at once, then the single-row sequences in paged
// mla_decode launches (DSA: indexer_decode_scores + top-k), each longer sequence's chunk by two
// GEMMs over its gathered latent, or with a fused plan one indexer_topk + one mla_sparse over
// the pages; always the absorbed form (equal to the expanded one to fp32 rounding). Top-k sets
// agree (ties to the smaller key); the switch is src/backend/ops.cpp's.
#pragma once

#include <cstdint>

#include "hymoe/backend/ctx.h"
#include "hymoe/backend/latent_cache.h"
#include "hymoe/tensor/tensor.h"

namespace hymoe::backend::cuda {
struct IndexerPlan;
struct MlaSparsePlan;
}  // namespace hymoe::backend::cuda

namespace hymoe::ops {

using backend::Ctx;
using backend::LatentCache;

// Queries a block of the CPU form's scores (model.h's prefill chunks are a multiple of it).
constexpr int64_t kMlaQueryBlock = 256;
// The most attention scores one group of the CUDA form holds (decode groups of sequences, prefill
// blocks of queries), 256 MiB; the GPU model's decode-graph workspace keeps room for it.
constexpr int64_t kMlaScoreFloats = int64_t{64} << 20;

// Row t of c_kv [n, r_kv], k_r [n, d_r] and k_idx [n, d_I] (empty: none) → token pos[t] of
// block-table row row_seq[t] (i32 [n], pos i64 [n], all on ctx's device; the pages must cover it).
void latent_append(const Ctx& ctx,
                   const LatentCache& cache,
                   const Tensor& row_seq,
                   const Tensor& pos,
                   const Tensor& c_kv,
                   const Tensor& k_r,
                   const Tensor& k_idx);

// model::AttnMode's forms.
enum class MlaForm { automatic, expanded, absorbed, sparse };

// The indexer scores of a block of queries summed over the tp ranks' heads (null fn: one rank).
struct ScoreReduce {
    void (*fn)(Tensor& scores, const void* arg) = nullptr;
    const void* arg = nullptr;
};

// The call's rows on the device (the GPU model's step): caches[0] holds every sequence, at its
// block-table row. A CPU context reads that layout too (a view a sequence), and none of the rest
// (the decode rows and fused plans are the GPU's launches).
struct MlaDeviceRows {
    const int32_t* row_seq = nullptr;    // [n_tok] block-table row of each row
    const int32_t* visible = nullptr;    // [n_tok] keys each row sees: its position + 1
    int64_t n_one = 0;                   // sequences with a single row (decode)
    const int64_t* one_rows = nullptr;   // [n_one] their rows
    const int32_t* one_table = nullptr;  // [n_one, max_pages] their block tables
    const int32_t* one_keys = nullptr;   // [n_one] their keys, the query's own included
    int64_t one_max_keys = 0;
    // DSA fused (both set): one indexer_topk and one mla_sparse over every row
    const backend::cuda::IndexerPlan* indexer_plan = nullptr;
    const backend::cuda::MlaSparsePlan* sparse_plan = nullptr;
    int fused_top_k = 0;
};

// o [n_tok, H·d_v] of the call's rows (sequence s: rows offsets[s] .. offsets[s+1], positions
// pos0[s] + i) over their caches, which already hold them. Per head h, with q̂_h = [W_kvb[h,
// :d_n]ᵀ q_n,h | q_r,h]: o_h = W_kvb[h, d_n:] · softmax(τ q̂_h [c_kv | k_r]ᵀ over the visible
// keys, DSA: the indexer's top-k of them) · c_kv.
struct MlaAttendParams {
    int64_t n_head = 0, d_n = 0, d_r = 0, d_v = 0, r_kv = 0;  // H and the MLA widths
    float tau = 1.0f;
    int64_t idx_heads = 0, idx_dim = 0, top_k = 0;  // DSA (top_k > 0): H_I, d_I, top-k
    MlaForm form = MlaForm::automatic;
    Tensor q;      // [n_tok, H·(d_n+d_r)] per head [q_n | q_r]
    Tensor kv_b;   // [H·(d_n+d_v), r_kv] W_kvb, any weight dtype
    Tensor q_idx;  // [n_tok, H_I·d_I] DSA: indexer queries
    Tensor w_idx;  // [n_tok, H_I] DSA: indexer head weights (scaled)
    Tensor o;      // [n_tok, H·d_v]
    int64_t n_seq = 0;
    const int64_t* offsets = nullptr;  // [n_seq + 1] host
    const int64_t* pos0 = nullptr;     // [n_seq] host
    // [n_seq] one view a sequence (block-table row 0); with `rows`: caches[0], block-table row s
    const LatentCache* caches = nullptr;
    ScoreReduce reduce;                   // DSA under tp
    double* indexer_seconds = nullptr;    // added to: the indexer's wall time (CUDA: synchronised)
    const MlaDeviceRows* rows = nullptr;  // a device step's (CUDA: required with caches[0])
};
void mla_attend(const Ctx& ctx, const MlaAttendParams& p);

// The CPU forms.
void latent_append(const LatentCache& cache,
                   const int32_t* row_seq,
                   const int64_t* pos,
                   const Tensor& c_kv,
                   const Tensor& k_r,
                   const Tensor& k_idx);
void mla_attend(const MlaAttendParams& p);

}  // namespace hymoe::ops

namespace hymoe::backend::cuda {
// The CUDA forms (CUDA builds only).
void latent_append(const Ctx& ctx,
                   const LatentCache& cache,
                   const Tensor& row_seq,
                   const Tensor& pos,
                   const Tensor& c_kv,
                   const Tensor& k_r,
                   const Tensor& k_idx);
void mla_attend(const Ctx& ctx, const ops::MlaAttendParams& p);
}  // namespace hymoe::backend::cuda
