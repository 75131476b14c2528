// One layer of the model as every pass runs it, and the one loop over a stage's layers (h +=
// mixer(RMSNorm₁ h); h += ffn(RMSNorm₂ h)) that the inference forward (model.cpp, on any Ctx: the
// CPU model and the model on a device of model/device alike) and the training pass (train.cpp,
// train_blocks.h, with its reverse) run, each through its LayerBlocks. An inference step reaches
// its sequences' states through a StepStates: the host's SequenceStates, or the GPU model's step
// tables. Every MoE layer goes through the one MoE path (model/moe_parallel.h; groups of one on
// one rank).
#pragma once

#include <functional>
#include <vector>

#include "hymoe/model/attention_views.h"
#include "hymoe/model/kda_views.h"
#include "hymoe/model/model.h"
#include "hymoe/model/model_on.h"

namespace hymoe::model::detail {

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

// How one pass runs a stage's blocks on its device, for the layer loop: an inference step's
// (layer.cpp) or a training pass's (train_blocks.h). Every tensor lives on ctx().device.
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

// How one inference step's mixers reach its sequences' states on the pass's device: each KDA
// layer's states, each attention layer's cache (host KvPool pages, or the layer's rows and pages
// on the device), the adapters' rows, and the step's hooks (a KV tier's prefetch and release).
class StepStates {
public:
    // Attention layer i's cache of every sequence: caches [n_seq] (host pages, advanced by the
    // call) or, with a device's rows, `dev` (the caller's end_step advances the counts).
    struct Attention {
        std::vector<AttnCache*> caches;
        const DeviceAttnRows* dev = nullptr;
    };
    virtual ~StepStates() = default;
    // kda_forward's batch for KDA layer i (valid until the next call).
    virtual KdaBatchViews kda(int i) = 0;
    // Attention layer i's caches, right before it runs (its pages made ready); leave_attention
    // right after.
    virtual Attention attention(int i) = 0;
    virtual void leave_attention(int i) = 0;
    // The factor-view adapters' rows of each adapter (null: none).
    virtual const std::vector<LoraRowsView>* lora_rows() const = 0;
    // Each row's adapter for the FFNs' host adapters and routed experts (null: adapter 0).
    virtual const SeqBatch* ffn_rows() const = 0;
    // The step's end: its sequences' attention caches hold its rows.
    virtual void end_step() = 0;
};

// The stage's layers of on.m on h [n, d] in place for one inference step over batch (n = 0: the
// MoE layers' collectives alone), through step's states: run_layers on the one inference blocks.
// timed: the blocks' wall times with the device caught up at each (options.stats).
void run_step_layers(const ModelOn& on,
                     const SeqBatch& batch,
                     StepStates& step,
                     const ForwardOptions& options,
                     Tensor& h,
                     ForwardStats& stats,
                     bool timed);

// The checks of a forward call (model_on.h), before anything runs: tokens and states for the
// batch, each state at its sequence's position, the rows for `top` (null: none), and on the first
// stage every token id (check_tokens).
void check_forward(const ModelConfig& cfg,
                   bool first_stage,
                   const std::vector<int64_t>& tokens,
                   const SeqBatch& batch,
                   const std::vector<SequenceState*>& states,
                   const ForwardOptions& options,
                   const TopLogits* top);
// Every token id within cfg's vocabulary (Exit::internal naming the first that is not).
void check_tokens(const ModelConfig& cfg, const std::vector<int64_t>& tokens);

// top ← out [r, V]'s rows (on ctx's device) reduced to top.n tokens each (TopLogits), copied to
// the host.
void download_top(const backend::Ctx& ctx, backend::Scratch& s, const Tensor& out, TopLogits& top);

// h [n, d] f32 = the first stage's input: the embedding rows of tokens (checked by the caller:
// check_tokens) with media's rows spliced in (null: none).
void embed_input(const ModelOn& on,
                 const std::vector<int64_t>& tokens,
                 const MediaSplice* media,
                 Tensor& h);

// The pipeline's messages of a pass on ctx's device go through host memory over MPI: the sends
// must not block (in 1F1B a stage sends its next stream while its neighbour sends a gradient
// back), which device sends over NCCL would. A device tensor is staged in `staged` first (keep it
// until the request completes); recv_on uploads what it received.
comm::Request send_start_on(const backend::Ctx& ctx,
                            const Tensor& x,
                            Buffer& staged,
                            int dest,
                            const comm::Comm& c,
                            int tag);
void recv_on(const backend::Ctx& ctx, Tensor& x, int src, const comm::Comm& c, int tag);

// h [n, d] f32 = the embedding rows of ids (i64 [n] on on.ctx's device, checked against the
// vocabulary), vocab-parallel under tp (each rank writes the rows it holds; an all-reduce
// completes h).
void embed_ids(const ModelOn& on, const Tensor& ids, Tensor& h);

// out [r, V] f32 = the head of final_norm(rows [r, d]) (vocab_logits under tp).
void head_logits(const ModelOn& on, const Tensor& rows, Tensor& out);

// forward (model_on.h) with the step's states as `step` addresses them; the call checked
// (check_forward) by the caller.
void forward_step(const ModelOn& on,
                  const std::vector<int64_t>& tokens,
                  const SeqBatch& batch,
                  StepStates& step,
                  const std::vector<SequenceState*>& states,
                  Buffer& logits,
                  const ForwardOptions& options,
                  TopLogits* top);

}  // namespace hymoe::model::detail
