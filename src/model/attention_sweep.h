// The expanded (MHA) attention of fresh sequences (every pos0 = 0, no cache) as ops on a Ctx,
// shared by attention_backward and the training forward on views
// (model/attention_backward_views.h): the forward recomputed from x, keeping what the backward
// reads, and the backward sweep. Per sequence, block of ≤ 256 queries and head h:
//   P = softmax(τ Q_h K_hᵀ + mask),  K_h = [k_n,h | k_r] and V_h gathered per head [n_s, ·],
// mask causal or (DSA) each query's top-k keys by the indexer, its scores summed over tp.
// Private to src/model.
#pragma once

#include "hymoe/backend/ctx.h"
#include "hymoe/model/attention_backward_views.h"
#include "hymoe/parallel/comm.h"
#include "mla_project.h"

namespace hymoe::model::detail {

// One call: its context, config, batch and positions.
struct FreshCall {
    const backend::Ctx& ctx;
    const ModelConfig& cfg;
    const LayerSpec& spec;
    const SeqBatch& batch;
    Tensor pos;                      // i64 [n_tok] on ctx's device
    const comm::Comm* tp = nullptr;  // dsa under tp: the indexer's scores summed over its ranks
    bool dsa() const { return spec.mixer == Mixer::dsa; }
};

// Checks the call (what: the entry's name): an MLA or DSA layer, x, dy, dx [n_tok, d] (dy, dx
// null: not checked), fresh sequences, positions i64 [n_tok] or none, no k or v factor views.
void check_fresh(const char* what,
                 const ModelConfig& cfg,
                 const LayerSpec& spec,
                 const MlaWeightViews& w,
                 const Tensor& x,
                 const AttnBatchViews& b,
                 const Tensor* dy,
                 const Tensor* dx);

// b.pos, or each row's position in its sequence uploaded into scratch.
Tensor fresh_positions(const backend::Ctx& ctx, backend::Scratch& scratch, const AttnBatchViews& b);

// The forward's activations, in the caller's scratch on ctx's device.
struct FreshActs {
    ProjectedViews p;  // c_q, q (rotated), c_kv, k_r (rotated); a_q, a_kv before the norms
    Tensor q_idx, k_idx, w_idx;  // dsa: [n_tok, H_I·d_I], [n_tok, d_I], [n_tok, H_I]
    Tensor kvb;                  // [n_tok, H·(d_n+d_v)] per head [k_n | v]
    Tensor o;                    // [n_tok, H·d_v] attention output, before the gate
    Tensor g;                    // [n_tok, H·d_v] σ(W_g x) (gated only)
};
FreshActs fresh_forward(const FreshCall& c,
                        backend::Scratch& scratch,
                        const MlaWeightViews& w,
                        const Tensor& x);  // [n_tok, d]

// The sweep's backward from d_o [n_tok, H·d_v]: dq [n_tok, H·(d_n+d_r)] (of the rotated q), dkvb
// [n_tok, H·(d_n+d_v)] and dk_r [n_tok, d_r] (of the rotated k_r), all overwritten.
void attend_backward(const FreshCall& c,
                     const FreshActs& a,
                     const Tensor& d_o,
                     Tensor& dq,
                     Tensor& dkvb,
                     Tensor& dk_r);

}  // namespace hymoe::model::detail
