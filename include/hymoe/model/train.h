// The training forward and backward of the whole model over one packed batch (spec/model-math.md
// §9): embedding → layers (h += mixer(norm h); h += ffn(norm h)) → final norm → LM head →
// cross-entropy on the rows that have a target. The base weights are frozen; the gradient flows
// back through every block into the LoRA adapters hooked into the model (model/lora_model.h),
// which accumulate it. Activations: the residual stream before every mixer and every FFN is kept
// (2 rows of d per token per layer), and each block's backward recomputes its own internals from
// its input; with `recompute` only the layer inputs are kept and the mixer is rerun to get the
// FFN's input. Each packed sequence starts fresh (KDA state and conv tails zero, attention over
// itself only): documents packed into one row never see each other.
// One rank holds the whole model here (tp = pp = ep = 1); data parallelism is the caller's.
#pragma once

#include <cstdint>
#include <vector>

#include "hymoe/model/model.h"

namespace hymoe::model {

struct TrainBatch {
    std::vector<int64_t> tokens;   // [n_tok]
    std::vector<int64_t> targets;  // [n_tok] the token to predict after each row; −1: no loss
    SeqBatch batch;                // the sequences over the rows, every pos0 = 0
    MediaSplice media;             // image tokens replacing placeholder rows (frozen vision
                                   //   tower: they are inputs and get no gradient)
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
    std::vector<std::vector<int64_t>>* expert_load = nullptr;  // [n_layer][E] += assignments
};

// Forward and backward: the loss sums of the batch; the adapters' gradients accumulate.
LossSums train_forward_backward(const Model& m, const TrainBatch& b, const TrainOptions& options);

// Forward only: the loss sums (evaluation).
LossSums evaluate_loss(const Model& m, const TrainBatch& b);

// The router distribution of every MoE layer on the batch, p = s/Σs (sigmoid scoring) or the
// softmax: [n_layer] entries, [n_tok, E] for MoE layers and empty for the others.
std::vector<Buffer> router_distributions(const Model& m, const TrainBatch& b);

}  // namespace hymoe::model
