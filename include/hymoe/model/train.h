// The training forward and backward of the whole model over one packed batch (spec/model-math.md
// §9): embedding → layers (h += mixer(norm h); h += ffn(norm h)) → final norm → LM head →
// cross-entropy on the rows that have a target. The base weights are frozen; the gradient flows
// back through every block into the LoRA adapters hooked into the model (model/lora_model.h),
// which accumulate it. Activations: the residual stream before every mixer and every FFN is kept
// (2 rows of d per token per layer), and each block's backward recomputes its own internals from
// its input; with `recompute` only the layer inputs are kept and the mixer is rerun to get the
// FFN's input. Each packed sequence starts fresh (KDA state and conv tails zero, attention over
// itself only): documents packed into one row never see each other.
// Model parallelism as in the inference forward (model/model.h): each rank runs its stage's layers
// on its tp part, the mixers' and dense FFNs' partial outputs are all-reduced over tp, MoE layers
// dispatch over ep (model/moe_parallel.h), and the head's logits are gathered over tp. The
// backward mirrors it: a block's input gradient from this rank's heads and widths is partial and
// is all-reduced over tp; the stages pass the residual stream forward and its gradient back in
// the 1F1B order. Adapter gradients are left as this rank's partial sums: the caller sums each
// over the ranks that hold the same slice (runtime/lora_grads.h). Data parallelism is the
// caller's too.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "hymoe/backend/ctx.h"
#include "hymoe/model/model.h"
#include "hymoe/model/model_on.h"
#include "hymoe/model/model_views.h"

namespace hymoe::model {

struct TrainBatch {
    std::vector<int64_t> tokens;   // [n_tok]
    std::vector<int64_t> targets;  // [n_tok] the token to predict after each row; −1: no loss
    SeqBatch batch;                // the sequences over the rows, every pos0 = 0
    MediaSplice media;             // image tokens replacing placeholder rows (frozen vision
                                   //   tower: they are inputs and get no gradient)
    uint64_t dropout_seed = 0;     // the adapters' dropout masks of this micro-batch
};

// Sums over a batch (not means), so they add over micro-batches and ranks.
struct LossSums {
    double loss = 0;           // Σ −log p(target) over the rows with a target
    int64_t targets = 0;       // rows with a target
    int64_t correct = 0;       // of those, rows whose argmax is the target
    int64_t seqs = 0;          // sequences with at least one target
    int64_t seqs_correct = 0;  // of those, sequences with every target right
    void add(const LossSums& o);
};

struct TrainOptions {
    bool recompute = false;   // keep only layer inputs; rerun the mixer in the backward
    double grad_scale = 1.0;  // the adapters receive ∂(grad_scale · Σ loss)
    // [n_layer][E] += the assignments this rank's experts computed (counted on etp rank 0 only):
    // summed over the world they are the step's expert load
    std::vector<std::vector<int64_t>>* expert_load = nullptr;
    // The adapter slots with dropout: each pass of a micro-batch sets their dropout_seed to its
    // TrainBatch::dropout_seed first (1F1B interleaves the micro-batches' passes).
    std::vector<LoraSlot*> dropout_slots;
};

// Where a training pass runs: this rank's model (its config, shard and communicators; the first
// stage's embedding is read from its host table) and its weights as views on ctx's device: the
// CPU's host_views(m) with the adapters as host slots, or a GPU's uploaded weights with the
// adapters as factor views with gradient views (model/lora_factors.h), which then accumulate the
// adapters' gradients. Every tensor of `weights` lives on ctx.device.
using TrainOn = ModelOn;

// Forward and backward of one optimizer step's micro-batches through this rank's stage, in the
// 1F1B order (warm-up forwards, one forward one backward, cool-down backwards; pp = 1: each
// micro-batch's forward then its backward): the loss sums of all of them, the same on every rank
// of the pipeline; the adapters' gradients accumulate. Every rank of the dp replica passes the
// same micro-batches.
LossSums train_forward_backward(const TrainOn& on,
                                std::span<const TrainBatch> micro,
                                const TrainOptions& options);
// The same on m's own weights and host adapters (the CPU).
LossSums train_forward_backward(const Model& m,
                                std::span<const TrainBatch> micro,
                                const TrainOptions& options);
inline LossSums train_forward_backward(const Model& m,
                                       const TrainBatch& b,
                                       const TrainOptions& options) {
    return train_forward_backward(m, std::span<const TrainBatch>(&b, 1), options);
}

// Forward only: the loss sums (evaluation), the same on every rank of the pipeline.
LossSums evaluate_loss(const TrainOn& on, const TrainBatch& b);
LossSums evaluate_loss(const Model& m, const TrainBatch& b);

// The router distribution of every MoE layer of this stage on the batch, p = s/Σs (sigmoid
// scoring) or the softmax: [n_layer] entries, [n_tok, E] for this stage's MoE layers and empty
// for the others, on the host. The pass runs on on's device (the GPU trainer's factors as they
// are there); the router's logits come down, one [n_tok, E] copy a layer.
std::vector<Buffer> router_distributions(const TrainOn& on, const TrainBatch& b);
std::vector<Buffer> router_distributions(const Model& m, const TrainBatch& b);

}  // namespace hymoe::model
