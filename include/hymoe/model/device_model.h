// The model on an accelerator, as the inference engine sees it (runtime/engine.h
// EngineOptions::device): its weights, its KV pages and every sequence's KDA state live on the
// device, and one call runs a forward over a packed batch with model::forward's arguments and
// results, so the engine's batching, paging and sampling are the same on either side. The
// engine's page bookkeeping stays in the host KvPool (block tables, free list); the rows are in
// the store kv_store() makes (on the device), or host_kv_store() (in host memory, staged on the
// device a step's layer at a time). The CUDA implementation is model/cuda_model.h (CUDA builds);
// this interface is plain C++ in every build.
// Invariants: a sequence made by new_sequence(), and a store made by kv_store() or
// host_kv_store(), must not outlive the model; one forward at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hymoe/model/batch.h"
#include "hymoe/model/kv_cache.h"
#include "hymoe/model/model.h"
#include "hymoe/model/model_on.h"

namespace hymoe::model {

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
    // One line for the log: device, dtype, memory used by the weights.
    virtual std::string describe() const = 0;
};

}  // namespace hymoe::model
