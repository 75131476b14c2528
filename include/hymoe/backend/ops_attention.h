// The ops of the MLA/DSA block (model/attention.cpp, spec/model-math.md §4-5) beside the products
// and norms of ops.h. CPU forms first (backend/cpu/attention_ops.cpp): one head's softmax
// attention and the DSA indexer's scores, causal top-k selection and mask. Then the ops on a Ctx
// (backend/ctx.h): those, RoPE over the strided heads of a row, a column slice, the indexer key's
// LayerNorm, and a call's host data (the positions) copied to ctx's device. CPU: exactly the CPU
// forms; CUDA: the kernels of backend/cuda_ops.h, cuda_model_ops.h and cuda_gemm.h (tests/cuda
// compares them). The device switch is src/backend/ops.cpp's.
#pragma once

#include <cstdint>

#include "hymoe/backend/ctx.h"
#include "hymoe/backend/ops.h"
#include "hymoe/tensor/tensor.h"

namespace hymoe::ops {

// One head's softmax attention: o = softmax(q kᵀ·τ + mask) v, scores and softmax in fp32. mask
// holds 0 (visible) or −inf (hidden); a row with no visible key gives o = 0.
void attention_core(const Tensor& q,     // [n_q, d_qk]
                    const Tensor& k,     // [n_k, d_qk]
                    const Tensor& v,     // [n_k, d_v]
                    const Tensor& mask,  // [n_q, n_k]
                    float tau,
                    Tensor& o);  // [n_q, d_v]

// The DSA indexer's scores I(t, s) = Σ_j w_t,j · ReLU(q^I_t,j · k^I_s) of n_q queries against n_k
// keys (the scale is already in w); no mask.
void indexer_scores(const Tensor& q,  // [n_q, H_I·d_I]
                    const Tensor& w,  // [n_q, H_I]
                    const Tensor& k,  // [n_k, d_I]
                    Tensor& scores);  // [n_q, n_k]

// The DSA selection: query i (at position pos_first + i) keeps its n_keep[i] = min(index_topk,
// visible) highest-scoring keys among keys 0..pos_first + i (ties: the smaller index, the keys of
// ops::top_k), written in ascending key order to keep[i·index_topk ..].
void indexer_select(const Tensor& scores,  // [n_q, n_k]
                    int64_t pos_first,
                    int64_t index_topk,
                    int64_t* keep,     // [n_q, index_topk]
                    int64_t* n_keep);  // [n_q]

// The DSA mask: query i (at position pos_first + i) keeps the top_k = min(index_topk, visible)
// highest-scoring keys among keys 0..pos_first + i (ties: the smaller index) → 0; every other key
// → −inf.
void indexer_mask(const Tensor& scores,  // [n_q, n_k]
                  int64_t pos_first,
                  int64_t index_topk,
                  Tensor& mask);  // [n_q, n_k]

using backend::Ctx;

// The same on ctx's device (indexer_select has no CUDA form: its outputs are host arrays).
void attention_core(const Ctx& ctx,
                    const Tensor& q,
                    const Tensor& k,
                    const Tensor& v,
                    const Tensor& mask,
                    float tau,
                    Tensor& o);
void indexer_scores(
    const Ctx& ctx, const Tensor& q, const Tensor& w, const Tensor& k, Tensor& scores);
void indexer_mask(
    const Ctx& ctx, const Tensor& scores, int64_t pos_first, int64_t index_topk, Tensor& mask);

// ops::rope on the rows of x [n_tok, width] (f32): in row t, heads h < n_head starting at column
// col0 + h·head_stride, at position pos[t] (pos [n_tok] int64 on ctx's device).
void rope(const Ctx& ctx,
          Tensor& x,
          int64_t col0,
          int64_t n_head,
          int64_t head_stride,
          const Tensor& pos,
          const RopeFreqs& freqs,
          bool interleaved);
// dst [n, w] = columns [col0, col0 + w) of src [n, width] (MLA's latent split, the norms' inputs
// kept for the backward); f32 or bf16, src and dst alike.
void copy_cols(const Ctx& ctx, const Tensor& src, int64_t col0, Tensor& dst);
// ops::layer_norm per row of x.dim(-1) (the indexer key); y may alias x.
void layer_norm(
    const Ctx& ctx, const Tensor& x, const Tensor& w, const Tensor& b, float eps, Tensor& y);
// dst (on ctx's device) ← the host tensor src, same dtype and element count. CUDA: queued on
// ctx's stream; pageable host memory (a std::vector, a Buffer) is staged before the call returns,
// so src may go right after.
void upload(const Ctx& ctx, const Tensor& src, Tensor& dst);

}  // namespace hymoe::ops
