// A pass of the model on one device (a Ctx), for the inference forward and the training pass
// (model/train.h) alike: this rank's model (its config, shard and communicators), its weights as
// views on the Ctx's device (model/model_views.h: the CPU's host_views, or a GPU's uploaded
// weights), and how the blocks run there. forward() below is model::forward (model.h) on it: the
// one inference forward, which the CPU model and the GPU model (model/device_model.h) both run.
#pragma once

#include <cstdint>
#include <vector>

#include "hymoe/backend/ctx.h"
#include "hymoe/model/model.h"
#include "hymoe/model/model_views.h"

namespace hymoe::model {

struct ModelOn {
    const Model& m;
    const backend::Ctx& ctx;
    const ModelViews& weights;  // every tensor on ctx.device
    DType act = DType::f32;     // the dense FFNs' input dtype (a GPU's compute dtype)
    bool fused = true;          // fused kernels where they apply (MoeParallel::fused)
    bool ep_overlap = false;    // MoE layers over ep in two micro-batches
};

// The last row of each sequence reduced on the pass's device, so that a step sends the host a
// few numbers a row instead of [n_seq, V] logits: the row's n best tokens in the sampler's order
// (logit descending, ties to the smaller id), their logits, and log Σ_j e^{x_j − max} summed in
// double (max = the first logit), from which runtime/sampler.h's rules give the same tokens
// and logprobs as from the whole row (greedy n ≥ 1, top-k sampling n ≥ top_k, top logprobs n ≥ N).
struct TopLogits {
    int n = 0;                    // tokens kept a row: set by the caller
    std::vector<int64_t> tokens;  // [rows, n]
    std::vector<float> logits;    // [rows, n]
    std::vector<double> log_sum;  // [rows]
};

// model::forward on `on`, a CPU context: the same arguments and results, states made by
// make_sequence_state (their KDA buffers and KvPool pages on the host). A device model runs the
// same forward with its own step states (model/device_model.h). With `top` (options.logits ==
// last, 1 ≤ top->n ≤ V) the last stage's rows come back reduced to *top and `logits` is left
// empty.
void forward(const ModelOn& on,
             const std::vector<int64_t>& tokens,
             const SeqBatch& batch,
             const std::vector<SequenceState*>& states,
             Buffer& logits,
             const ForwardOptions& options = {},
             TopLogits* top = nullptr);

}  // namespace hymoe::model
