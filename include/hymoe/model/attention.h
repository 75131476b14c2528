// Multi-head latent attention (MLA, DeepSeek-V3 / Kimi-Linear), its DSA form (lightning indexer +
// top-k sparse attention, DeepSeek-V3.2) and the sigmoid output gate, on the CPU in fp32
// (spec/model-math.md §4-5). Per token, with H heads:
//   c_q = RMSNorm(W_qa x) (or q = W_q x without a query latent), [q_n | q_r]_h = (W_qb c_q)_h,
//   [c_kv | k_r] = W_kva x, c_kv = RMSNorm(c_kv), q_r, k_r = RoPE_interleaved(·, pos),
//   [k_n | v]_h = (W_kvb c_kv)_h, s_h(t, u) = (q_n·k_n(u) + q_r·k_r(u))·τ over the visible keys u,
//   o_h = softmax(s_h) v_h, y = W_o (concat_h o_h [⊙ σ(W_g x)]).
// A layer caches per token only c_kv and k_r (the 576-wide latent at DeepSeek size) plus, for DSA,
// the indexer key. Two equal evaluations: `expanded` (MHA: k_n, v up-projected for every cached
// token) and `absorbed` (MQA over the latent: W_kvb folded into the query and the output).
// Invariants: a sequence's AttnCache is everything the layer needs to continue it, so a prompt
// fed in one call, in chunks or token by token gives the same output; scores and softmax are
// fp32; a DSA layer whose top-k covers every visible key equals the plain MLA layer.
#pragma once

#include <cstdint>
#include <vector>

#include "hymoe/backend/ops.h"
#include "hymoe/model/batch.h"
#include "hymoe/model/config.h"
#include "hymoe/model/lora.h"
#include "hymoe/model/weights.h"
#include "hymoe/parallel/comm.h"
#include "hymoe/tensor/tensor.h"

namespace hymoe::model {

// Sizes below: d = hidden_size, H = mla.n_head, r_q = q_lora_rank, r_kv = kv_lora_rank,
// d_n = qk_nope_head_dim, d_r = qk_rope_head_dim, d_v = v_head_dim, H_I = indexer.n_head,
// d_I = indexer.head_dim.

// The DSA lightning indexer's weights, HF names under "self_attn.indexer.".
struct IndexerWeights {
    Buffer wq_b;           // [H_I·d_I, r_q]  queries from MLA's query latent c_q
    Buffer wk;             // [d_I, d]        the one key head, shared by all indexer heads
    Buffer k_norm_weight;  // [d_I]           LayerNorm of the key ("k_norm.weight")
    Buffer k_norm_bias;    // [d_I]           ("k_norm.bias")
    Buffer weights_proj;   // [H_I, d]        per-token head weights w_t
};

// One MLA/DSA layer's weights, HF DeepSeek names (model.layers.{i}.self_attn.*).
struct MlaWeights {
    Buffer q_a_proj;            // [r_q, d]            query down-projection (r_q > 0)
    Buffer q_a_layernorm;       // [r_q]               q_norm (r_q > 0)
    Buffer q_b_proj;            // [H·(d_n+d_r), r_q]  query up-projection (r_q > 0)
    Buffer q_proj;              // [H·(d_n+d_r), d]    full-rank query (r_q = 0, Kimi-Linear)
    Buffer kv_a_proj_with_mqa;  // [r_kv+d_r, d]       latent c_kv and the shared rope key k_r
    Buffer kv_a_layernorm;      // [r_kv]              kv_norm
    Buffer kv_b_proj;           // [H·(d_n+d_v), r_kv] per head [k_n | v] from c_kv
    Buffer o_proj;              // [d, H·d_v]
    Buffer g_proj;              // [H·d_v, d]          output gate (gated layers only)
    IndexerWeights indexer;     // dsa layers only
    LoraSlots lora;             // adapters on q (q_proj or q_b_proj), kv (kv_a_proj_with_mqa), o
};

// The layer's weights as named tensors, names relative to the layer's "self_attn." prefix: the
// query path by q_lora_rank, g_proj when spec.gated, indexer.* when spec.mixer == dsa. Norm
// weights init to ones, the indexer's LayerNorm bias to zeros, the rest normal(0.02). Fills w
// (null: the shapes alone, model/tensor_list.h).
TensorList attention_tensors(const ModelConfig& cfg, const LayerSpec& spec, MlaWeights* w);
inline TensorList attention_tensors(const ModelConfig& cfg, const LayerSpec& spec, MlaWeights& w) {
    return attention_tensors(cfg, spec, &w);
}

class KvPool;

// What one sequence carries, per layer, from one call to the next: for every token u < n its
// latent c_kv [r_kv] (after kv_a_layernorm), shared rope key k_r [d_r] (after RoPE) and, dsa
// only, indexer key k_idx [d_I] (after LayerNorm and RoPE). Grown by attention_forward. Paged
// (the engine): the rows live in `pool`'s pages listed in `pages`, which must already cover the
// call's new tokens (KvPool::reserve). Otherwise in the three private arrays below.
struct AttnCache {
    int64_t n = 0;  // tokens cached (= the position of the sequence's next token)
    KvPool* pool = nullptr;
    const std::vector<int32_t>* pages = nullptr;  // the sequence's block table
    int layer = -1;                               // this cache's layer in the pool
    std::vector<float> c_kv;                      // [n, r_kv] private storage
    std::vector<float> k_r;                       // [n, d_r]
    std::vector<float> k_idx;                     // [n, d_I]
};

enum class AttnMode {
    automatic,  // absorbed for a sequence with a single token in the call, else sparse (dsa) or
                // expanded (mla)
    expanded,   // MHA form: k_n, v = W_kvb c_kv for every cached token
    absorbed,  // MQA form over [c_kv | k_r]: q̂_h = W_kvb[h, :d_n]ᵀ q_n, o_h = W_kvb[h, d_n:] ō_h
    sparse,    // DSA: the absorbed form per query over its own top-k latent rows only (gathered),
               // so a query costs O(top-k), not O(context); the automatic choice for a DSA
               // sequence with more than one token in the call (MLA: as automatic)
};

// Where the time of attention_forward went (added to, so one struct can sum over layers).
struct AttnStats {
    double indexer_seconds = 0;    // indexer projections, scores and top-k (dsa)
    double attention_seconds = 0;  // everything else
};

// The MLA/DSA mixer over a packed batch: y [n_tok, d] from x [n_tok, d] (already input-normed).
// caches[s] holds sequence s's pos0[s] earlier tokens and gains its new ones; an empty `caches`
// means no cache at all (every pos0 must then be 0 and nothing is kept). The steps run as ops on
// ctx (model/attention_views.h says which so far; the rest needs a CPU context).
void attention_forward(const backend::Ctx& ctx,
                       const ModelConfig& cfg,
                       const LayerSpec& spec,  // mixer mla or dsa, gated or not
                       const MlaWeights& w,
                       const Tensor& x,                        // [n_tok, d]
                       const SeqBatch& batch,                  // n_seq sequences over the rows
                       const std::vector<AttnCache*>& caches,  // [n_seq] or empty
                       Tensor& y,                              // [n_tok, d]
                       AttnMode mode = AttnMode::automatic,
                       AttnStats* stats = nullptr,
                       const comm::Comm* tp = nullptr);  // cfg a tp rank's local config: the
                                                         // indexer's partial scores summed here

// Backward of attention_forward without a cache, for sequences that start fresh (every
// batch.pos0 = 0: the training case, spec/model-math.md §9), in the expanded (MHA) form: the
// forward is recomputed from x; DSA's top-k selection is a constant and the indexer gets no
// gradient (its input is detached by design). dx [n_tok, d] is overwritten with ∂L/∂x through
// the query, latent and gate paths; the adapters in w.lora accumulate their gradients.
void attention_backward(const ModelConfig& cfg,
                        const LayerSpec& spec,
                        const MlaWeights& w,
                        const Tensor& x,  // [n_tok, d]
                        const SeqBatch& batch,
                        const Tensor& dy,                 // [n_tok, d]
                        Tensor& dx,                       // [n_tok, d]
                        const comm::Comm* tp = nullptr);  // as attention_forward's

// ---- building blocks ----------------------------------------------------------------------------

// The RoPE frequencies of MLA and the indexer: d_r/2 of them at rope_theta, YaRN-corrected when
// rope_scaling = yarn, with cos/sin scaled by HF's ratio get_mscale(f, mscale) /
// get_mscale(f, mscale_all_dim), get_mscale(f, m) = 0.1·m·ln f + 1 (1 when f ≤ 1).
ops::RopeFreqs mla_rope_freqs(const MlaConfig& mla);

// The indexer's per-token inputs for the new tokens of a call.
struct IndexerInputs {
    Buffer q;  // [n_tok, H_I·d_I] q^I = wq_b c_q, RoPE (rotate-half) on the first d_r of each head
    Buffer k;  // [n_tok, d_I]     k^I = LayerNorm(wk x; ε 1e-6), RoPE on the first d_r
    Buffer w;  // [n_tok, H_I]     weights_proj x · H_I^{-1/2} · d_I^{-1/2}
};
IndexerInputs indexer_project(const ModelConfig& cfg,
                              const IndexerWeights& w,
                              const Tensor& x,                   // [n_tok, d]
                              const Tensor& c_q,                 // [n_tok, r_q] after q_norm
                              const std::vector<int64_t>& pos);  // [n_tok] absolute positions

// The attention core, the indexer's scores, selection and mask: ops::attention_core,
// indexer_scores, indexer_select, indexer_mask (backend/ops_attention.h).

}  // namespace hymoe::model
