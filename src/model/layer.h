// One layer of the model as every pass runs it: the mixer and the FFN its LayerSpec names, each
// with the tp reduction of its partial output, forward and backward, and the one loop over a
// stage's layers (h += mixer(RMSNorm₁ h); h += ffn(RMSNorm₂ h)) that the inference forward
// (model.cpp), the training pass (train.cpp, train_blocks.h, with its reverse) and the GPU model
// (model/cuda) all run, each through its LayerBlocks. Every MoE layer goes through the one
// MoE path (model/moe_parallel.h; groups of one on one rank).
#pragma once

#include <functional>
#include <vector>

#include "hymoe/model/model.h"

namespace hymoe::model::detail {

// How an inference step's mixers see their sequences: each continues its KDA state and attention
// cache (a training pass starts every sequence fresh: train_blocks.h).
struct MixerPass {
    const std::vector<SequenceState*>* states = nullptr;  // [n_seq]
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
// y [n, d] = layer i's FFN on xn [n, d], full on every rank of the tp group. rows names each
// row's adapter (null: adapter 0); stats (MoE layers) gets the layer's phases and expert load.
// Collective over tp and (MoE) ep: an MoE layer is called with n = 0 too.
void ffn_forward(
    const Model& m, int i, const Tensor& xn, Tensor& y, const SeqBatch* rows, MoeCommStats* stats);

// logits [k, V] = x [k, d] · headᵀ on ctx's device. Under tp (tp: the group; null: one rank)
// head [V/tp, d] holds this rank's vocabulary rows, and an all-gather over tp assembles the
// columns (rank p's block [k, V/tp] is row p·k + i of the gathered [tp·k, V/tp] and row i·tp + p
// of logits seen as [k·tp, V/tp]).
void vocab_logits(const backend::Ctx& ctx,
                  const Tensor& x,
                  const Tensor& head,
                  const comm::Comm* tp,
                  Tensor& logits);

// The MoE layers' groups of m's rank: tp and ep where they have more than one rank (null: a
// group of one).
MoeParallel moe_groups(const Model& m);

// Copies a training pass keeps of the residual stream as the loop passes (each optional).
struct LayerTaps {
    std::function<void(int, const Tensor&)> before_mixer;  // h [n, d] entering layer i
    std::function<void(int, const Tensor&)> before_ffn;    // h [n, d] after layer i's mixer
    std::function<void(int, const Tensor&)> moe_input;     // xn [n, d] into an MoE layer's FFN
};

// How one pass runs a stage's blocks on its device, for the layer loop: the CPU model's blocks
// on its Buffers and host states (ModelBlocks below), or the GPU model's on its device weights
// and step (model/cuda). Every tensor lives on ctx().device.
class LayerBlocks {
public:
    virtual ~LayerBlocks() = default;
    virtual const backend::Ctx& ctx() const = 0;
    virtual const Tensor& attn_norm(int i) const = 0;  // [d]
    virtual const Tensor& ffn_norm(int i) const = 0;   // [d]
    // y [n, d] = layer i's mixer on xn [n, d] (input-normed), full on every rank of the tp group.
    virtual void mixer(int i, const Tensor& xn, Tensor& y) = 0;
    // y [n, d] = layer i's FFN on xn [n, d]; stats (MoE layers) gets the layer's phases and load.
    virtual void ffn(int i, const Tensor& xn, Tensor& y, MoeCommStats* stats) = 0;
    // Wall seconds now, with the device caught up when the pass is timed (the layers' seconds).
    virtual double clock() const;
};

// The CPU model's blocks for one pass: mixer_forward and ffn_forward on m's weights, the batch's
// states as pass says, rows naming the FFN adapters' rows (null: adapter 0), and each
// attention layer announced to the step's KV pools (the offload tier's prefetch) as it starts.
class ModelBlocks final : public LayerBlocks {
public:
    // The step's pages told to its KV pools (each page once, in order of first use).
    ModelBlocks(const Model& m, const SeqBatch& batch, const MixerPass& pass, const SeqBatch* rows);
    const backend::Ctx& ctx() const override { return m_.ctx; }
    const Tensor& attn_norm(int i) const override { return m_.layers[i].attn_norm.view(); }
    const Tensor& ffn_norm(int i) const override { return m_.layers[i].ffn_norm.view(); }
    void mixer(int i, const Tensor& xn, Tensor& y) override;
    void ffn(int i, const Tensor& xn, Tensor& y, MoeCommStats* stats) override;
    void end_step() const;  // the step's end, told to its KV pools

private:
    const Model& m_;
    const SeqBatch& batch_;
    const MixerPass& pass_;
    const SeqBatch* rows_;
    std::vector<KvPool*> pools_;  // the pools the step's caches page into
};

// The layers [first, end) of cfg (the rank's local config) on h [n, d] in place through blocks:
// the only loop over layers. stats gets each layer's mixer and FFN seconds, GEMM FLOPs and
// seconds (and the blocks their attention split and MoE phases). With no rows (n = 0) only the
// MoE layers run, and only when moe_collective (their ep or tp group spans ranks with rows).
void run_layers(const ModelConfig& cfg,
                int first,
                int end,
                bool moe_collective,
                LayerBlocks& blocks,
                Tensor& h,
                ForwardStats& stats,
                const LayerTaps& taps = {});

// The stage's layers of m on h [n, d] in place, as forward() (model.h) runs them: run_layers
// through m's ModelBlocks. Collective as forward().
void run_layers(const Model& m,
                const SeqBatch& batch,
                const MixerPass& pass,
                const SeqBatch* rows,
                Tensor& h,
                ForwardStats& stats,
                const LayerTaps& taps = {});

}  // namespace hymoe::model::detail
