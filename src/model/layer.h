// One layer of the model as every pass runs it: the mixer and the FFN its LayerSpec names, each
// with the tp reduction of its partial output, forward and backward, and the one loop over a
// stage's layers (h += mixer(RMSNorm₁ h); h += ffn(RMSNorm₂ h)) that the inference forward
// (model.cpp) and the training pass (train.cpp) both run. Every MoE layer goes through the one
// MoE path (model/moe_parallel.h; groups of one on one rank).
#pragma once

#include <functional>
#include <vector>

#include "hymoe/model/model.h"

namespace hymoe::model::detail {

// How a pass's mixers see their sequences: an inference step continues each sequence's KDA state
// and attention cache; a training pass starts every sequence fresh (zero state, no cache, the
// expanded attention form its backward differentiates).
struct MixerPass {
    const std::vector<SequenceState*>* states = nullptr;  // [n_seq]; null: every sequence fresh
    KdaMode kda_mode = KdaMode::automatic;
    AttnMode attn_mode = AttnMode::expanded;
    AttnStats* attn_stats = nullptr;  // added to when given
};

// y [n, d] = layer i's mixer on xn [n, d] (input-normed), full on every rank of the tp group.
void mixer_forward(const Model& m,
                   int i,
                   const Tensor& xn,
                   const SeqBatch& batch,
                   const MixerPass& pass,
                   Tensor& y);
// dxn [n, d] = ∂L/∂xn of layer i's mixer from dy [n, d], every sequence fresh (training).
void mixer_backward(
    const Model& m, int i, const Tensor& xn, const SeqBatch& batch, const Tensor& dy, Tensor& dxn);

// y [n, d] = layer i's FFN on xn [n, d], full on every rank of the tp group. rows names each
// row's adapter (null: adapter 0); stats (MoE layers) gets the layer's phases and expert load.
// Collective over tp and (MoE) ep: an MoE layer is called with n = 0 too.
void ffn_forward(
    const Model& m, int i, const Tensor& xn, Tensor& y, const SeqBatch* rows, MoeCommStats* stats);
// dxn [n, d] = ∂L/∂xn of layer i's FFN from dy [n, d].
void ffn_backward(const Model& m, int i, const Tensor& xn, const Tensor& dy, Tensor& dxn);

// Copies a training pass keeps of the residual stream as the loop passes (each optional).
struct LayerTaps {
    std::function<void(int, const Tensor&)> before_mixer;  // h [n, d] entering layer i
    std::function<void(int, const Tensor&)> before_ffn;    // h [n, d] after layer i's mixer
    std::function<void(int, const Tensor&)> moe_input;     // xn [n, d] into an MoE layer's FFN
};

// The stage's layers on h [n, d] in place: the only loop over layers. stats gets each layer's
// mixer and FFN seconds, GEMM FLOPs and seconds, attention split and MoE phases; rows names the
// FFN adapters' rows (null: adapter 0). Collective as forward() (model.h).
void run_layers(const Model& m,
                const SeqBatch& batch,
                const MixerPass& pass,
                const SeqBatch* rows,
                Tensor& h,
                ForwardStats& stats,
                const LayerTaps& taps = {});

}  // namespace hymoe::model::detail
