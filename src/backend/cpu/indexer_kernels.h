// The AVX-512 kernels of the DSA indexer's scores: the AVX-512-BF16 one behind
// ops::indexer_scores_bf16 (backend/cpu/indexer_ops.cpp dispatches; indexer_bf16.cpp, compiled
// with -mavx512bf16, called only after the run-time cpuid check of ops::weight_kernel()) and the
// fp32 one behind ops::indexer_scores (indexer_scores.cpp dispatches; indexer_f32.cpp, called
// only when detail::f32_avx512_on()); and the top-k of a row of scores behind ops::indexer_select
// (indexer_select.cpp; indexer_topk.cpp, also when detail::f32_avx512_on()).
#pragma once

#include <cstdint>

namespace hymoe::ops::detail {

// scores [n_q, n_k] (row stride ld_s) = Σ_j w_t,j · ReLU(q_t,j · k_s): q [n_q, n_head, pairs] as
// bf16 pairs (dims 2p, 2p+1 in one 32-bit word, low half first), w [n_q, n_head] fp32, keys in
// ops::IndexerKeys tiles ([⌈n_k/16⌉, pairs, 16, 2] bf16). Per head and key one fp32 accumulator
// gains the pairs in order (VDPBF16PS: dim 2p+1's product, then 2p's); the heads are summed in
// order by fused multiply-adds.
void indexer_scores_avx512(const uint32_t* q,
                           const float* w,
                           int64_t n_q,
                           int64_t n_head,
                           int64_t pairs,
                           const uint16_t* keys,
                           int64_t n_k,
                           float* scores,
                           int64_t ld_s);

// scores [n_q, n_k] (row stride ld_s) = Σ_j w_t,j · ReLU(q_t,j · k_s): q [n_q, n_head, d], w
// [n_q, n_head], k [n_k, d] (rows d apart), all fp32. Per head and key one fp32 fused
// multiply-add chain over the dims in order from 0; the heads are summed in order from +0 by a
// multiply then an add (the bits of ops::gemm's AVX-512 GEMM then the ReLU/weight pass, d ≤ 256).
void indexer_scores_f32_avx512(const float* q,
                               const float* w,
                               int64_t n_q,
                               int64_t n_head,
                               int64_t d,
                               const float* k,
                               int64_t n_k,
                               float* scores,
                               int64_t ld_s);

// out [k] = the indices, ascending, of the k largest of x [0, n) (k ≤ n) in the strict order of
// ops::top_k (higher score first, ties to the smaller index; −0 = +0); u [n] scratch.
void indexer_top_avx512(const float* x, int64_t n, int64_t k, int64_t* out, uint32_t* u);

}  // namespace hymoe::ops::detail
