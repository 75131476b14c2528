// The model on a device, as the inference engine sees it (runtime/engine.h EngineOptions::device):
// its weights, its KV pages and every sequence's KDA state live on the device, and one call runs a
// forward over a packed batch with model::forward's arguments and results, so the engine's
// batching, paging and sampling are the same on either side. The engine's page bookkeeping stays
// in the host KvPool (block tables, free list); the rows are in the store kv_store() makes (on the
// device), or host_kv_store() (in host memory, staged on the device a step's layer at a time).
// make_device_model makes one on a GPU (CUDA builds) or on the CPU, with the same code
// (src/model/device/): the CPU's is how the tests hold the GPU's host logic (step tables, KDA
// blocks, uploads, adapters) to model::forward.
//
// The weights are uploaded once, matrices in bf16 or fp32 (fp32 accumulation either way) and norm
// weights, biases, gates and the router in fp32; the residual stream, norms, KDA state, attention
// scores and softmax, MoE combine and logits in fp32. The forward is the model's one forward
// (model/model_on.h, src/model/forward.cpp) on the device's weights and Ctx, with the step's
// states as its step tables address them (device_runtime.h TableStep):
//   - KDA: model::kda_forward over the whole packed batch, every sequence's state [H, K, V] and
//     conv tails on the device (one block a sequence: S slots of one pool on a GPU, which the
//     fused kernels address);
//   - MLA/DSA: the absorbed (MQA) form over the cached latent [c_kv | k_r] in the device pages;
//     on a GPU, DSA with fused kernels and bf16 matrices at widths they take
//     (model/fused_step.h): every row of the step in one fused indexer top-k and one sparse MLA
//     launch over the pages; otherwise prefill chunks per sequence and single-token rows of every
//     sequence in one paged decode launch;
//   - MoE: model::moe_forward_parallel on the device's Ctx, the routed experts stacked per layer
//     (one grouped GEMM reads them); with `fused` (bf16 SwiGLU dropless layers on a GPU), routing
//     and dispatch on the device too.
// Decode graphs (`graphs`, GPU only): a step whose every sequence has one row replays a CUDA graph
// captured per (batch bucket, key bucket) when it qualifies (model/decode_graph_plan.h: fused
// paths only, no stats, no media, KV pages resident on the device): its rows padded to the bucket
// with a dummy sequence, its metadata moved by one copy into fixed device buffers, its scratch in
// one fixed workspace, the real rows' logits (or top tokens) copied back
// (src/model/cuda/device_decode_graphs.h). Any other step runs eagerly, with the same results.
// Layout: the rank's part of the model as make_model(cfg, grid) cuts it: heads and widths over tp
// (each block's partial output summed over tp through comm::, the vocabulary split over tp: the
// embedding all-reduced, the head all-gathered), the stage's layers under pp (the residual stream
// handed between stages through host memory and MPI, ForwardOptions::stage_out included; only the
// last stage returns logits), the routed experts over ep and etp. Decode graphs only at
// tp = pp = ep = 1. ForwardOptions::kda_mode and attn_mode do not apply (one form of each block);
// with ForwardOptions::stats, each layer is timed between two stream synchronisations. The vision
// tower runs on the device too (src/model/device/device_vision.h). LoRA adapters
// (set_lora_adapters, src/model/device/device_lora.h): fp32 factors, each adapter's rows gathered
// per adapted projection; such steps run eagerly (no decode graph).
// Invariants: a sequence made by new_sequence(), and a store made by kv_store() or
// host_kv_store(), must not outlive the model; one forward at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hymoe/core/types.h"
#include "hymoe/model/batch.h"
#include "hymoe/model/kv_cache.h"
#include "hymoe/model/model.h"
#include "hymoe/model/model_on.h"

namespace hymoe::model {
struct DeviceModelOptions {
    Device device = Device::cuda;  // cuda: the current GPU (backend::select_device chose it)
    DType dtype = DType::bf16;     // the matrices on the device: bf16 or f32
    int max_tokens = 8192;         // rows of the largest step (workspace kept free for it)
    int max_seqs = 64;             // sequences running at once (their KDA states kept room for)
    bool logits_all = false;       // steps may ask for every row's logits (prompt logprobs)
    // The arena: arena_bytes when > 0 (a job's share of a GPU that several ranks may share,
    // runtime/device_choice.h device_arena_bytes), else memory_fraction of the device's free
    // memory when the model is made. CPU: arena_bytes is the budget of KV pages, KDA states and a
    // step beside the weights (kv_page_budget).
    size_t arena_bytes = 0;
    double memory_fraction = 0.9;
    // The fused kernels (backend/cuda_fused.h) where their constraints hold, the generic ops
    // otherwise; false: the generic ops throughout (for comparison).
    bool fused = true;
    // Pure decode steps (one row per sequence) replayed as CUDA graphs where they qualify
    // (model/decode_graph_plan.h: fused on, no stats or media, every block on a capture-safe
    // path, the KV pages resident); false: every step eagerly. GPU only.
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

class DeviceModel {
public:
    virtual ~DeviceModel() = default;

    // A new sequence (n_tokens 0): no host KDA buffers; its device state is made by the first
    // forward that sees it and freed with it. Pages come from attach_kv_pool as on the host.
    virtual SequenceState new_sequence() = 0;
    // The rows of a KvPool with `layout` (KvPool's make_store), allocated on the device at once
    // for all layout.capacity pages; a host read of them (KvStore::page) is an error.
    virtual std::unique_ptr<KvStore> kv_store(const KvLayout& layout) = 0;
    // KV pages of page_bytes that fit on the device next to the weights, with room kept for
    // max_seqs sequences' KDA states and one step of max_tokens rows.
    virtual int64_t kv_page_budget(int64_t page_bytes) const = 0;
    // The host tier (inference.kv_cache.offload: host): the rows of a KvPool with `layout` in
    // pinned host memory, and on the device only two slots for a step's pages of one attention
    // layer each (the running one and the next, prefetched); host reads (KvStore::page) work
    // between forwards.
    virtual std::unique_ptr<KvStore> host_kv_store(const KvLayout& layout) = 0;
    // The file tier (inference.kv_cache.offload: file): host_kv_store's, its host rows in the
    // spill file fd (read-write, at least runtime/kv_spill.h spill_file_bytes(layout) long, laid
    // out as the CPU's tier lays out its file) mapped shared instead of pinned memory; the store
    // owns fd. The kernel's page cache holds the rows, writes them back to the file and may
    // reclaim them; the copies between the mapping and the device slots are staged by the
    // driver (each waits for the host). host_kv_page_budget sizes it.
    virtual std::unique_ptr<KvStore> file_kv_store(const KvLayout& layout, int fd) = 0;
    // KV pages of page_bytes for host_kv_store: at most host_bytes of them in pinned memory, and
    // their slots (each up to all pages of one layer) on the device as kv_page_budget leaves room.
    virtual int64_t host_kv_page_budget(int64_t page_bytes, int64_t host_bytes) const = 0;
    // model::forward on the device: the same tokens, batch, states (from new_sequence, paged
    // into a pool of kv_store's) and options; logits come back to the host. With `top` (and
    // options.logits == last) the rows come back reduced to *top instead (top->n set, 1 ≤ n ≤ V)
    // and `logits` is left empty.
    virtual void forward(const std::vector<int64_t>& tokens,
                         const SeqBatch& batch,
                         const std::vector<SequenceState*>& states,
                         Buffer& logits,
                         const ForwardOptions& options,
                         TopLogits* top) = 0;
    // model::vision_forward on the device, for a model with a vision tower (cfg.vision.present):
    // images of grids that are multiples of merge·pool → out [Σ vision_tokens, d] f32 on the
    // host; stats (if given) gets the call's figures as vision_forward's.
    virtual void encode_images(const std::vector<VisionImage>& images,
                               int pool,
                               Tensor& out,
                               VisionStats* stats) = 0;
    // The LoRA adapters hooked into host's blocks (model/lora_model.h: attach_lora, then the
    // adapters added or loaded into its slots) uploaded to the device: from then on each
    // sequence's rows get its adapter (SeqBatch::adapter, as model/lora.h chooses) on every
    // adapted projection. Once, before the first forward; host is the model this one was made
    // from (only its slots are read).
    virtual void set_lora_adapters(const Model& host) = 0;
    // The prefix cache (runtime/prefix_cache.h) on the device: the KDA states of s (every KDA
    // layer's S and conv tails on this rank, as its latest forward left them) copied into host
    // memory, f32 in the model's own order; an empty buffer where the rank has no KDA layer.
    // Between forwards.
    virtual Buffer save_kda_states(const SequenceState& s) = 0;
    // The states save_kda_states took (from a sequence of this model) copied into s, one of this
    // model's sequences (a fresh one included), which goes on from them. Between forwards.
    virtual void load_kda_states(const Buffer& saved, SequenceState& s) = 0;
    // MoE layer `layer`'s routed experts as host (the model this one was made from) holds them
    // after model::place_experts moved them (expert rebalancing, model/eplb.h): the experts the
    // rank now hosts written over the device's (as many: E/ep a rank), and the routing's
    // placement taken. Between forwards; refused for a layer whose routed experts carry LoRA
    // adapters.
    virtual void place_experts(const Model& host, int layer) = 0;
    // One line for the log: device, dtype, memory used by the weights.
    virtual std::string describe() const = 0;
    // What the decode graphs have done so far (all zero while graphs are off).
    virtual DecodeGraphCounters graph_counters() const = 0;
    // Turns the decode graphs off or back on (benchmarks: one model, both paths); a model made
    // with graphs off, or whose decode steps cannot qualify, stays eager.
    virtual void set_graphs(bool on) = 0;
};

// Uploads `host` (a whole model: make_model(cfg) with its weights, or a rank's part:
// make_model(cfg, grid)) to options.device. The host model may be freed afterwards; at tp, pp or
// ep > 1 its comms (the grid) must outlive the device model.
std::unique_ptr<DeviceModel> make_device_model(const Model& host,
                                               const DeviceModelOptions& options);

}  // namespace hymoe::model
