// The model's two ends on a Ctx (model::forward): the vocab-parallel embedding lookup, and each
// logits row reduced to its top tokens for the host sampler (model::TopLogits), so that a device
// step sends the host a few numbers a row instead of [rows, V] logits. CPU forms are plain host
// loops (src/backend/cpu/head.cpp); CUDA forms are cuda_ops.h's embed_rows, top_k_rows and
// top_logit_rows. The switch: src/backend/ops_head.cpp.
#pragma once

#include "hymoe/backend/ctx.h"
#include "hymoe/tensor/tensor.h"

namespace hymoe::ops {

// h [n, d] f32 row t = table [rows, d] (f32, bf16 or f16, widened) row tokens[t] − lo when
// lo ≤ tokens[t] < lo + rows, else 0 (each tp rank holds the rows from lo). tokens i64 [n],
// already checked against the vocabulary by the caller.
void embed_rows(const Tensor& table, const Tensor& tokens, int64_t lo, Tensor& h);
void embed_rows(
    const backend::Ctx& ctx, const Tensor& table, const Tensor& tokens, int64_t lo, Tensor& h);

// For logits [r, V] f32: idx [r, n] i64 = each row's n largest (logit descending, ties to the
// smaller id: the sampler's order), values [r, n] f32 = their logits, log_sum [r] (8-byte
// elements, i64-typed, holding doubles) = log Σ_j e^{x_j − x[idx[·, 0]]} summed in double (as
// runtime::token_logprob). 1 ≤ n ≤ V.
void top_logits(const Tensor& logits, Tensor& idx, Tensor& values, Tensor& log_sum);
void top_logits(
    const backend::Ctx& ctx, const Tensor& logits, Tensor& idx, Tensor& values, Tensor& log_sum);

}  // namespace hymoe::ops
