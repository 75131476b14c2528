// The device kernels the GPU model (hymoe/model/device_model.h) needs beyond the op kernels of
// hymoe/backend/cuda_ops.h: dtype casts and row moves, the paged MLA/DSA cache's append and
// gather, the causal softmax of the absorbed attention over all heads at once, the DSA indexer's
// decode scores read from the pages and ReLU². A packed batch is the host's model::SeqBatch:
// sequence s owns rows [offsets[s], offsets[s+1]). Every pointer is a device pointer, every call
// asynchronous on `s`, all arithmetic fp32 in the CPU blocks' order.
// CUDA builds only (src/backend/cuda/model_ops.cu); no CUDA header here.
#pragma once

#include <cstddef>
#include <cstdint>

#include "hymoe/backend/cuda_arena.h"
#include "hymoe/tensor/tensor.h"

namespace hymoe::backend::cuda {

// ---- memory ------------------------------------------------------------------------------------

// Bytes free on the current device now (cudaMemGetInfo).
size_t device_free_bytes();
// Streaming multiprocessors of the current device (the fused kernels' plans size grids by it).
int device_sm_count();
// p[0, bytes) ← 0, queued on s.
void zero(void* p, size_t bytes, const Stream& s);

// ---- casts and row moves -----------------------------------------------------------------------

// dst ← src element by element, f32 ↔ bf16 (rounded to nearest even) or a plain copy; equal
// element counts.
void cast(const Stream& s, const Tensor& src, Tensor& dst);
// rows × cols elements of `dtype`, from src (row stride src_ld elements) to dst (stride dst_ld).
void copy_2d(const Stream& s,
             DType dtype,
             const void* src,
             int64_t src_ld,
             void* dst,
             int64_t dst_ld,
             int64_t rows,
             int64_t cols);
// dst [n, w] row i = src [m, w] row idx[i]; idx int64 [n]. f32 or bf16, src and dst alike.
void gather_rows(const Stream& s, const Tensor& src, const Tensor& idx, Tensor& dst);
// dst [m, w] row idx[i] = src [n, w] row i (distinct idx).
void scatter_rows(const Stream& s, const Tensor& src, const Tensor& idx, Tensor& dst);
// x ← ReLU(x)² (relu2 experts), f32 or bf16.
void relu2_inplace(const Stream& s, Tensor& x);
// dst [n] int32 = src [n] int64 (top-k key lists for mla_decode, −1 kept).
void narrow_indices(const Stream& s, const Tensor& src, Tensor& dst);

// ---- the paged MLA/DSA cache -------------------------------------------------------------------

// One layer's rows in the device pages (model::KvPool's layout): token u of sequence s is row
// u % page_tokens of page block_table[s, u / page_tokens], at pages + page·page_stride +
// slot·row_stride, and holds [c_kv r_kv | k_r d_r | k_idx d_I (dsa)].
struct KvPages {
    float* pages = nullptr;  // this layer's row 0 of page 0
    int64_t page_stride = 0;
    int64_t row_stride = 0;
    int page_tokens = 0;
    const int32_t* block_table = nullptr;  // [n_seq, max_pages]
    int max_pages = 0;
};

// Row of token t (sequence row_seq[t], position positions[t]) ← [c_kv [t] | k_r [t] | k_idx [t]]
// (k_idx null: d_i = 0), for t < n_tok.
void kv_append(const Stream& s,
               const KvPages& kv,
               int64_t n_tok,
               const int32_t* row_seq,
               const int64_t* positions,
               const float* c_kv,  // [n_tok, r_kv]
               int r_kv,
               const float* k_r,  // [n_tok, d_r]
               int d_r,
               const float* k_idx,  // [n_tok, d_i] or null
               int d_i);
// dst [n, width] = columns [col, col + width) of tokens 0 .. n−1 of sequence `seq`.
void kv_gather(
    const Stream& s, const KvPages& kv, int seq, int64_t n, int64_t col, int64_t width, float* dst);

// ---- attention ---------------------------------------------------------------------------------

// scores [n_q, H, n_k] in place, f32: row (i, h) keeps keys u ≤ pos_first + i plus, with a mask
// [n_q, n_k] (0 or −inf, the DSA top-k), mask[i, u] added; then the softmax of
// ops::attention_core (−inf → 0, a row with no key left → zeros).
void causal_softmax(
    const Stream& s, Tensor& scores, int64_t n_head, int64_t pos_first, const Tensor* mask);

// The DSA indexer's decode scores, one query per sequence, keys read from the pages:
// scores [B, max_keys] (b, u) = Σ_j w[b, j] · ReLU(q[b, j·d_I ..] · k_idx(u)) for u < n_keys[b]
// (ops::indexer_scores' order), −inf for u ≥ n_keys[b] (so that a top-k ranks the visible keys
// only and pads with larger ids). H_I·d_I ≤ 12288.
struct IndexerDecode {
    KvPages kv;
    int64_t col = 0;                  // k_idx's first column in a row (r_kv + d_r)
    int n_seq = 0;                    // B
    int n_head = 0;                   // H_I
    int head_dim = 0;                 // d_I
    const float* q = nullptr;         // [B, H_I·d_I]
    const float* w = nullptr;         // [B, H_I] (scaled)
    const int32_t* n_keys = nullptr;  // [B]
    int64_t max_keys = 0;
    float* scores = nullptr;  // [B, max_keys]
};
void indexer_decode_scores(const Stream& s, const IndexerDecode& p);

}  // namespace hymoe::backend::cuda
