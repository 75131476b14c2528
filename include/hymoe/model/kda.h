// Kimi Delta Attention (KDA), the linear-attention mixer of Kimi-Linear (spec/model-math.md §3),
// on the CPU in fp32. Per head h the block keeps a state S_h [K, V] and, for every token,
//   S' = e^{g_t} ⊙ S   (row-wise decay, g_t ≤ 0 [K]),   S = S' + β_t k_t (v_t − S'ᵀk_t)ᵀ,
//   o_t = Sᵀ q_t,
// with q, k, v from projection → causal depthwise conv → SiLU, q and k l2-normalised per head (q
// also scaled by K^{-1/2}), g from a low-rank decay projection and β = σ(b_proj x). The output is
// o_proj(RMSNorm(o_h; o_norm) ⊙ σ(gate)). Two equal evaluations of the recurrence: the naive
// per-token scan (decode) and the chunked WY form (prefill), which evaluates exponentials only on
// the causal triangle, so no intermediate overflows however strong the decay.
// Invariant: a sequence's KdaState (recurrent state + conv tails) is everything the block needs
// to continue it, so a prompt fed in one call, in chunks, or token by token gives the same output.
#pragma once

#include <cstdint>
#include <vector>

#include "hymoe/backend/ctx.h"
#include "hymoe/backend/kda_params.h"
#include "hymoe/model/batch.h"
#include "hymoe/model/config.h"
#include "hymoe/model/lora.h"
#include "hymoe/model/weights.h"
#include "hymoe/tensor/tensor.h"

namespace hymoe::model {

// One KDA layer's weights, HF Kimi names (model.layers.{i}.self_attn.*). d = hidden_size,
// H = kda.n_head, K = V = kda.head_dim, D = H·K, W = kda.conv_kernel.
struct KdaWeights {
    Buffer q_proj;    // [D, d]
    Buffer k_proj;    // [D, d]
    Buffer v_proj;    // [D, d]
    Buffer q_conv1d;  // [D, 1, W] as stored by HF; used as [D, W]
    Buffer k_conv1d;  // [D, 1, W]
    Buffer v_conv1d;  // [D, 1, W]
    Buffer f_a_proj;  // [K, d]  low-rank decay logits, down
    Buffer f_b_proj;  // [D, K]  low-rank decay logits, up
    Buffer dt_bias;   // [D]     decay bias
    Buffer a_log;     // [1, 1, H, 1] as stored by HF ("A_log"); used as [H]
    Buffer b_proj;    // [H, d]  β logits
    Buffer g_a_proj;  // [K, d]  low-rank output gate, down (no bias)
    Buffer g_b_proj;  // [D, K]  low-rank output gate, up (no bias)
    Buffer o_norm;    // [K]     per-head output RMSNorm weight ("o_norm.weight")
    Buffer o_proj;    // [d, D]
    LoraSlots lora;   // adapters on q, k, v, o (q_proj, k_proj, v_proj, o_proj); none by default
};

// The weights as named tensors, names relative to the layer's "self_attn." prefix, with the fla
// init rules (A_log = log U(1, 16), dt_bias = inverse softplus of dt, o_norm ones, else normal),
// filling w (null: the shapes alone, model/tensor_list.h).
TensorList kda_tensors(const ModelConfig& cfg, KdaWeights* w);
inline TensorList kda_tensors(const ModelConfig& cfg, KdaWeights& w) {
    return kda_tensors(cfg, &w);
}

// What one sequence carries from one call to the next.
struct KdaState {
    Buffer S;       // [H, K, V] fp32 recurrent state
    Buffer q_tail;  // [W−1, D] the last W−1 inputs of the q conv (zeros for a new sequence)
    Buffer k_tail;  // [W−1, D]
    Buffer v_tail;  // [W−1, D]
};

// A zeroed state: a new sequence.
KdaState make_kda_state(const ModelConfig& cfg);

// The recurrence of one sequence and its gradients (backend/kda_params.h): one POD struct for both
// backends; the scans themselves are backend ops (hymoe/backend/ops.h: ops::kda_recurrent,
// kda_chunked, kda_chunked_checkpoints, kda_scan_backward).
using ops::KdaScanGrads;
using ops::KdaScanParams;

enum class KdaMode {
    automatic,  // chunked for a sequence with more than one token in the call, recurrent for one
    chunked,
    recurrent,
};

// The KDA mixer over a packed batch: y [n_tok, d] from x [n_tok, d] (already input-normed).
// states[s] is sequence s's state, continued and updated in place (batch.pos0 is not read: the
// state alone says where the sequence stands).
void kda_forward(const backend::Ctx& ctx,
                 const ModelConfig& cfg,
                 const KdaWeights& w,
                 const Tensor& x,                       // [n_tok, d]
                 const SeqBatch& batch,                 // n_seq sequences over the n_tok rows
                 const std::vector<KdaState*>& states,  // [n_seq]
                 Tensor& y,                             // [n_tok, d]
                 KdaMode mode = KdaMode::automatic);

// Backward of kda_forward for sequences that start fresh (every batch.pos0 = 0, zero state: the
// training case, spec/model-math.md §9): recomputes the forward from x, keeping the recurrent
// state only at chunk boundaries and recomputing each chunk's states from them in the reverse
// sweep (never inverting the decay); dx [n_tok, d] is overwritten with ∂L/∂x, and the adapters
// in w.lora accumulate their gradients. The frozen weights get none.
void kda_backward(const backend::Ctx& ctx,
                  const ModelConfig& cfg,
                  const KdaWeights& w,
                  const Tensor& x,  // [n_tok, d] the forward's input
                  const SeqBatch& batch,
                  const Tensor& dy,  // [n_tok, d] ∂L/∂y
                  Tensor& dx,        // [n_tok, d]
                  int chunk = 64);

}  // namespace hymoe::model
