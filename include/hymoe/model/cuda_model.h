// The whole model on one NVIDIA GPU (a model::DeviceModel): weights uploaded once, matrices in
// bf16 or fp32 (fp32 accumulation either way) and norm weights, biases, gates and the router in
// fp32; the residual stream, norms, KDA state, attention scores and softmax, MoE combine and
// logits in fp32. The forward runs the CPU blocks' math (model/kda.h, attention.h, ffn.h) on the
// ops of hymoe/backend/cuda_ops.h and cuda_model_ops.h:
//   - KDA: model::kda_forward itself on a CUDA context (model/kda_views.h), the causal conv and
//     the recurrence over the whole packed batch in one launch each (backend/kda_batch.h), every
//     sequence's state [H, K, V] and conv tails on the device;
//   - MLA/DSA: the absorbed (MQA) form over the cached latent [c_kv | k_r] in the device pages;
//     DSA with fused kernels and bf16 matrices at widths they take (model/fused_step.h): every
//     row of the step in one fused indexer top-k and one sparse MLA launch over the pages;
//     otherwise prefill chunks per sequence (scores by GEMM, causal softmax, DSA mask from the
//     indexer's top-k) and single-token rows of every sequence in one paged decode launch (DSA:
//     the top-k of the indexer's scores read from the pages);
//   - MoE: router logits on the device, the routing itself (top-k, groups, capacity) on the host
//     with the CPU's code (one device-to-host copy of [n_tok, E] logits a layer), then permute,
//     grouped expert GEMMs and the slot-ordered combine on the device; with `fused` (bf16
//     SwiGLU dropless layers), routing and dispatch on the device too.
// Decode graphs (`graphs`): a step whose every sequence has one row replays a CUDA graph captured
// per (batch bucket, key bucket) when it qualifies (model/decode_graph_plan.h: fused paths only,
// no stats, no media, KV pages resident on the device): its rows padded to the bucket with a
// dummy sequence, its metadata moved by one copy into fixed device buffers, its scratch in one
// fixed workspace, the real rows' logits (or top tokens) copied back (src/model/cuda/
// device_decode_graphs.h). Any other step runs eagerly, with the same results.
// The forward is the model's one forward (model/model_on.h, src/model/forward.cpp) on this
// model's device weights and Ctx, with the step's states as its step tables address them: the
// embedding, the one layer loop, the hand-over between stages and the head or each row's top
// tokens are the CPU's code. Layout: the rank's part of the model as make_model(cfg, grid) cuts
// it: heads and widths over tp (each block's partial output summed over tp through comm::, the
// vocabulary split over tp as on the CPU: the embedding all-reduced, the head all-gathered), the
// stage's layers under pp (the residual stream handed between stages through host memory and
// MPI, ForwardOptions::stage_out included; only the last stage returns logits), the routed
// experts over ep and etp (model::moe_forward_parallel on the device's Ctx). Decode graphs only
// at tp = pp = ep = 1. ForwardOptions::kda_mode and attn_mode do not apply (one form of each
// block); with ForwardOptions::stats, each layer is timed between two stream synchronisations.
// The vision tower runs on the device too (src/model/cuda/device_vision.h: the encoder's GEMMs
// in the matrices' dtype, the rest fp32; patchify and the position tables on the host). LoRA
// adapters (set_lora_adapters, src/model/cuda/device_lora.h): fp32 factors, each adapter's rows
// gathered per adapted projection, two fp32 GEMMs and the rows added back; an MoE layer with
// routed-expert adapters routes on the host in a step that uses one, and such steps run eagerly
// (no decode graph). make_cuda_model exists in CUDA builds only (src/model/cuda/);
// the header is plain C++.
#pragma once

#include <cstddef>
#include <memory>

#include "hymoe/core/types.h"
#include "hymoe/model/device_model.h"
#include "hymoe/model/model.h"

namespace hymoe::model {

struct CudaModelOptions {
    DType dtype = DType::bf16;  // the matrices on the device: bf16 or f32
    int max_tokens = 8192;      // rows of the largest step (workspace kept free for it)
    int max_seqs = 64;          // sequences running at once (their KDA states kept room for)
    bool logits_all = false;    // steps may ask for every row's logits (prompt logprobs)
    // The arena: arena_bytes when > 0 (a job's share of a GPU that several ranks may share,
    // runtime/device_choice.h device_arena_bytes), else memory_fraction of the device's free
    // memory when the model is made.
    size_t arena_bytes = 0;
    double memory_fraction = 0.9;
    // The fused kernels (backend/cuda_fused.h) where their constraints hold, the generic ops
    // otherwise; false: the generic ops throughout (for comparison).
    bool fused = true;
    // Pure decode steps (one row per sequence) replayed as CUDA graphs where they qualify
    // (model/decode_graph_plan.h: fused on, no stats or media, every block on a capture-safe
    // path, the KV pages resident); false: every step eagerly.
    bool graphs = true;
    // Bytes of activations a pass of the vision encoder may hold (images are encoded in passes
    // under it); 0: the room a step of max_tokens keeps free.
    int64_t vision_scratch_bytes = 0;
    // ep > 1: each MoE layer's rows in two micro-batches, one's all-to-all running while the
    // other's experts compute (false: one batch, the exchange then the experts).
    bool ep_overlap = true;
};

// What the decode graphs of a GPU model have done so far.
struct DecodeGraphCounters {
    int64_t graph_steps = 0;  // steps replayed as a graph
    int64_t warmups = 0;      // first uses of a (batch bucket, key bucket), run eagerly once
    int64_t captures = 0;     // graphs captured
    int64_t refreshes = 0;    // graphs re-captured for another KV store of the same geometry
    int64_t resets = 0;       // times every graph was dropped for a store of another geometry
};

// Uploads `host` (a whole model: make_model(cfg) with its weights, or a rank's part:
// make_model(cfg, grid)) to the current device (backend::select_device has chosen it). The host
// model may be freed afterwards; at tp, pp or ep > 1 its comms (the grid) must outlive the
// device model.
std::unique_ptr<DeviceModel> make_cuda_model(const Model& host, const CudaModelOptions& options);
// The counters of a model make_cuda_model made (all zero while graphs are off).
DecodeGraphCounters decode_graph_counters(const DeviceModel& model);
// Turns the decode graphs of a model make_cuda_model made off or back on (benchmarks: one model,
// both paths); a model made with graphs off, or whose decode steps cannot qualify, stays eager.
void set_decode_graphs(DeviceModel& model, bool on);

}  // namespace hymoe::model
