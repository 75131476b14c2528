// The KDA block's conv and recurrence over a whole packed batch, one op each (model/kda.cpp): the
// POD sequence table both backends take, valid on the Ctx's device, and the ops on a Ctx. The CPU
// forms loop over the sequences with the one-sequence kernels (ops::causal_conv, kda_recurrent,
// kda_chunked) in order; the CUDA forms are single launches (src/backend/cuda/conv.cu, kda.cu) and
// pick the fused kernels of cuda_fused.h where they apply. The device switch is
// src/backend/ops.cpp's.
#pragma once

#include <cstdint>

#include "hymoe/backend/ctx.h"
#include "hymoe/tensor/tensor.h"

namespace hymoe::ops {

// A packed batch and one KDA layer's state of each of its sequences: sequence s owns rows
// [offsets[s], offsets[s + 1]). Every pointer, and every pointer an array holds, is memory of the
// Ctx's device; the counts are the host's.
struct KdaSeqTable {
    int64_t n_tok = 0;                 // rows of the batch
    int64_t n_seq = 0;                 //
    int64_t max_len = 0;               // rows of the longest sequence (1: a decode step)
    const int64_t* offsets = nullptr;  // [n_seq + 1]
    const int32_t* row_seq = nullptr;  // [n_tok] each row's sequence (CUDA; the CPU reads offsets)
    float* const* state = nullptr;     // [n_seq] S [H, K, V] fp32, in and out
    float* const* tail[3] = {};        // [n_seq] each: the conv tails [W−1, D] of q, k and v
    // Optional: the same S as slots of one pool, state[s] = pool + slot[s]·H·K·V (the addressing
    // of the CUDA fused kernels, which run only with a pool).
    float* pool = nullptr;
    const int32_t* slot = nullptr;  // [n_seq]
};

// The recurrence's inputs and output over the packed rows (KdaScanParams' layout, rows of every
// sequence one after the other) and the choice of its form.
struct KdaBatchScan {
    int n_head = 0;               // H
    int d_k = 0;                  // K
    int d_v = 0;                  // V
    const float* q = nullptr;     // [n_tok, H, K] l2-normalised, scaled by K^{-1/2}
    const float* k = nullptr;     // [n_tok, H, K] l2-normalised
    const float* v = nullptr;     // [n_tok, H, V]
    const float* g = nullptr;     // [n_tok, H, K] log-decay, ≤ 0
    const float* beta = nullptr;  // [n_tok, H]
    float* o = nullptr;           // [n_tok, H, V]
    // A sequence of at least chunk_from rows runs chunked (CPU: kda_chunked), a shorter one token
    // by token (kda_recurrent); INT64_MAX: every one token by token.
    int64_t chunk_from = 2;
    // CUDA may use the chunked prefill's bf16 tensor-core products (a bf16 model's tolerance).
    bool bf16_products = false;
};

// out [n_tok, D] = SiLU(causal_conv(u [n_tok, D], w [D, W])) per sequence, each continuing its
// tail of `plane` (0 q, 1 k, 2 v), tails updated in place. CPU form, then the op on a Ctx.
void kda_conv_silu(const KdaSeqTable& t, const Tensor& u, const Tensor& w, int plane, Tensor& out);
// The recurrence of every sequence, each continuing its state.
void kda_scan_batch(const KdaSeqTable& t, const KdaBatchScan& p);

void kda_conv_silu(const backend::Ctx& ctx,
                   const KdaSeqTable& t,
                   const Tensor& u,
                   const Tensor& w,
                   int plane,
                   Tensor& out);
void kda_scan_batch(const backend::Ctx& ctx, const KdaSeqTable& t, const KdaBatchScan& p);

}  // namespace hymoe::ops
