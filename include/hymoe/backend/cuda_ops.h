// The CUDA kernels of the op interface (hymoe/backend/ops.h), one per CPU op with the CPU op's
// exact semantics (ops.h is the reference; tests/cuda compares them). Every tensor is a device
// tensor (Device::cuda), f32 or bf16 storage with fp32 arithmetic, and all tensors of one call
// share that dtype unless stated. Calls are asynchronous on `s`; shapes are checked on the host.
// CUDA builds only (src/backend/cuda/{norm,elementwise,softmax,rope,top_k,sample,
// conv,moe,kda,indexer,mla_decode,embed}.cu).
#pragma once

#include <cstdint>

#include "hymoe/backend/cuda_arena.h"
#include "hymoe/backend/kda_params.h"
#include "hymoe/backend/ops.h"
#include "hymoe/tensor/tensor.h"

namespace hymoe::backend::cuda {

// ---- normalisation (norm.cu) -----------------------------------------------------------------

// As ops::rms_norm / ops::layer_norm, per row of x.dim(-1); y may alias x.
void rms_norm(const Stream& s, const Tensor& x, const Tensor& w, float eps, Tensor& y);
void layer_norm(
    const Stream& s, const Tensor& x, const Tensor& w, const Tensor& b, float eps, Tensor& y);
// As ops::l2_norm_rows over rows of x.dim(-1), in place.
void l2_norm_rows(const Stream& s, Tensor& x, float eps = 1e-6f);

// ---- elementwise (elementwise.cu) ------------------------------------------------------------

void silu_inplace(const Stream& s, Tensor& x);
void sigmoid_inplace(const Stream& s, Tensor& x);
// y = SiLU(gate) ⊙ up; y may alias gate.
void swiglu(const Stream& s, const Tensor& gate, const Tensor& up, Tensor& y);
// x ← x + y
void add_inplace(const Stream& s, Tensor& x, const Tensor& y);
// x ← x ⊙ y (the KDA output gate)
void mul_inplace(const Stream& s, Tensor& x, const Tensor& y);
// x ← c · x (KDA's q · K^{-1/2})
void scale_inplace(const Stream& s, Tensor& x, float c);

// ---- softmax (softmax.cu) --------------------------------------------------------------------

// As ops::softmax_rows over rows of x.dim(-1), in place: −inf entries get 0, an all −inf row
// becomes all 0.
void softmax_rows(const Stream& s, Tensor& x);

// ---- positions (rope.cu) ---------------------------------------------------------------------

// As ops::rope on a device buffer of `dtype` (f32 or bf16): x is the first rotated element of
// head 0 of token 0, strides in elements; pos [n_tok] int64 on the device. The frequencies travel
// in the launch (at most kMaxRopePairs = 256 pairs, rot_dim ≤ 512).
constexpr int kMaxRopePairs = 256;
void rope(const Stream& s,
          DType dtype,
          void* x,
          int64_t n_tok,
          int64_t n_head,
          int64_t token_stride,
          int64_t head_stride,
          const int64_t* pos,
          const ops::RopeFreqs& freqs,
          bool interleaved);

// ---- selection (top_k.cu) --------------------------------------------------------------------

// idx [rows, k] int64 = ops::top_k of every row of x [rows, n] (f32): the k largest, best
// first, ties to the smaller index. One block per row: k passes over short rows (n ≤ 1024) or
// when k > 4096; otherwise a radix select and a bitonic sort (the DSA indexer's long rows).
void top_k_rows(const Stream& s, const Tensor& x, int64_t k, Tensor& idx);
// The same with a causal cut: row r ranks only its first pos_first + r + 1 entries and keeps
// k_r = min(k, pos_first + r + 1) of them; idx [rows, k] entries past k_r are −1.
void top_k_rows_causal(const Stream& s, const Tensor& x, int64_t pos_first, int64_t k, Tensor& idx);
// ops::indexer_mask on the device: mask [n_q, n_k] f32 = 0 at each query's causal top-k keys
// (index_topk of keys 0 .. pos_first + i), −inf elsewhere; idx [n_q, min(index_topk, n_k)] int64
// receives the kept keys (−1 padded), for the sparse attention to gather.
void indexer_mask(const Stream& s,
                  const Tensor& scores,
                  int64_t pos_first,
                  int64_t index_topk,
                  Tensor& idx,
                  Tensor& mask);

// ---- greedy decoding and logprobs (sample.cu) ------------------------------------------------

// For every row of logits [rows, V] (f32): tokens [rows] int64 = the argmax, ties to the smallest
// id (runtime::argmax_token), and logprobs [rows] f32 = its log_softmax, summed in double
// (runtime::token_logprob). One block per row.
void greedy_rows(const Stream& s, const Tensor& logits, Tensor& tokens, Tensor& logprobs);
// logprobs [rows] f32 = runtime::token_logprob of the given tokens [rows] int64 (prompt
// logprobs: the row of position t scored at token t + 1).
void token_logprobs(const Stream& s, const Tensor& logits, const Tensor& tokens, Tensor& logprobs);
// A row's top tokens reduced for the host sampler (model::TopLogits): idx [rows, n] int64 from
// top_k_rows(logits, n), values [rows, n] f32 = the logits there, log_sum [rows] doubles on the
// device = log Σ_j e^{x_j − x[idx[r, 0]]}, summed in double (as runtime::token_logprob).
void top_logit_rows(
    const Stream& s, const Tensor& logits, const Tensor& idx, Tensor& values, double* log_sum);

// ---- causal depthwise conv (conv.cu) ---------------------------------------------------------

// As ops::causal_conv for one sequence: u, y [T, C] (y may not alias u), w [C, W],
// tail [W−1, C] read, then replaced by the last W−1 inputs.
void causal_conv(const Stream& s, const Tensor& u, const Tensor& w, Tensor& tail, Tensor& y);

// ---- MoE dispatch and combine (moe.cu) -------------------------------------------------------

// The dispatch of model/moe.cpp: in [n_rows, w] row row[a] = z [n_tok, w] row a / k for every
// assignment a < n_tok·k with row[a] ≥ 0 (−1: dropped); row [n_tok·k] int64 on the device, from
// the host's dispatch plan (each expert's rows contiguous). Rows no assignment names are kept.
void moe_permute(const Stream& s, const Tensor& z, const Tensor& row, int64_t k, Tensor& in);
// The combine of model/moe.cpp: acc [n_tok, w] row t = Σ_{i<k, row[t·k+i] ≥ 0} weight[t·k+i] ·
// out [n_rows, w] row row[t·k+i], summed in fp32 in slot order (so it does not depend on the
// order the experts ran in); weight [n_tok·k] f32 on the device; acc in out's dtype or f32.
void moe_unpermute(const Stream& s,
                   const Tensor& out,
                   const Tensor& row,
                   const Tensor& weight,
                   int64_t k,
                   Tensor& acc);

// ---- KDA recurrence (kda.cu) -----------------------------------------------------------------

// ops::kda_recurrent on the device: the same KdaScanParams with every pointer a device pointer
// (q, k, g [T, H, K], v, o [T, H, V], beta [T, H], S [H, K, V] fp32 state in and out). One thread
// per (head, value column) owns that column of S through all T tokens, so the decode step (T = 1)
// reads and writes the state once per pass; sums run over K in the CPU's order.
void kda_recurrent(const Stream& s, const ops::KdaScanParams& p);
// KDA's decay gate in place (model/kda.cpp decay_gate), f32: g [n_tok, H·K] holds the decay
// logits f and becomes, with z = f + dt_bias [H·K] and a = e^{a_log[h]} (a_log [H]),
//   −a · softplus(z)    or, with a lower bound lb (has_lower_bound),   lb · σ(a · z).
void kda_decay_gate(const Stream& s,
                    Tensor& g,
                    const Tensor& a_log,
                    const Tensor& dt_bias,
                    bool has_lower_bound,
                    float lower_bound);

// ---- DSA lightning indexer (indexer.cu) -----------------------------------------------------

// ops::indexer_scores on the device, f32: scores [n_q, n_k] (t, s) = Σ_j w[t, j] ·
// ReLU(q[t, j·d_I ..] · k[s]) for q [n_q, H_I·d_I], w [n_q, H_I] (already scaled), k [n_k, d_I];
// every key, unmasked (the causal cut is the top-k's). H_I·d_I ≤ 12288 (a query in shared memory).
void indexer_scores(
    const Stream& s, const Tensor& q, const Tensor& w, const Tensor& k, Tensor& scores);

// ---- MLA absorbed decode over pages (mla_decode.cu) ------------------------------------------

// One decode step of MLA in the absorbed (MQA) form (model/attention.cpp attend_absorbed, after
// the q̂ projection and before the W_kvb[h, d_n:] output product), reading the latent cache in
// place from its pages. For sequence b and head h, over the keys u of b (all of its n_keys, or
// the valid entries of its DSA top-k list):
//   s_u = τ · q̂_{b,h} · [c_kv | k_r]_u,   ō_{b,h} = Σ_u softmax(s)_u · c_kv_u
// A key row is [c_kv r_kv | k_r d_r | ...] (KvPool's layer row); token u of b lives in page
// block_table[b, u / page_tokens], slot u % page_tokens. Every pointer is a device pointer.
struct MlaDecodeParams {
    int n_seq = 0;                         // B
    int n_head = 0;                        // H
    int r_kv = 0;                          // latent width
    int d_r = 0;                           // rope key width
    float tau = 1.0f;                      // softmax scale
    const float* q_hat = nullptr;          // [B, H, r_kv + d_r]
    const float* pages = nullptr;          // this layer's row 0 of page 0
    int64_t page_stride = 0;               // floats from a page's rows to the next page's
    int64_t row_stride = 0;                // floats from one token row to the next in a page
    int page_tokens = 0;                   // tokens a page
    const int32_t* block_table = nullptr;  // [B, max_pages] page ids in token order
    int max_pages = 0;
    const int32_t* n_keys = nullptr;    // [B] tokens in the cache (the query is the last)
    const int32_t* selected = nullptr;  // [B, n_selected] DSA keys (−1: none), or null: all
    int n_selected = 0;
    int max_keys = 0;         // ≥ every n_keys (and n_selected): scores' row
    float* scores = nullptr;  // [B, H, max_keys] scratch
    float* o_bar = nullptr;   // [B, H, r_kv] output
};
void mla_decode(const Stream& s, const MlaDecodeParams& p);

// ---- embedding (embed.cu) --------------------------------------------------------------------

// h [n, d] row t = table [rows, d] row tokens[t] − lo when lo ≤ tokens[t] < lo + rows, else 0
// (the vocab-parallel embedding of model.cpp: each tp rank holds rows from lo). tokens [n] int64
// on the device, already checked against the vocabulary on the host.
void embed_rows(const Stream& s, const Tensor& table, const Tensor& tokens, int64_t lo, Tensor& h);

}  // namespace hymoe::backend::cuda
