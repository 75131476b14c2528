// The GPU model's class (model/cuda_model.h make_cuda_model), private to src/model/cuda/: the
// device state of a sequence, the KV store of pages on the device, and CudaModel, whose parts
// live in three files: device_model.cpp (weights, memory budgets, adapters, images, the
// factories), device_step.cpp (a step's packed batch on the device) and device_forward.cpp (the
// forward, eager or as a decode graph).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "device_blocks.h"
#include "device_decode_graphs.h"
#include "device_kv_offload.h"
#include "device_vision.h"
#include "hymoe/core/error.h"
#include "hymoe/model/cuda_model.h"

namespace hymoe::model {

// A sequence's KDA states on the device: S [n_kda_layers, H, K, K] fp32, then the conv tails
// [n_kda_layers, 3, W−1, D] (planes q, k, v: model::KdaStateViews' tails), made and zeroed by the
// first forward that sees the sequence. S starts at a multiple of H·K·K floats from the arena's
// base, so that each layer's S is a slot of one pool there (the fused kernels' addressing,
// cuda_fused.h KdaBatchParams).
struct DeviceSequence {
    backend::cuda::DeviceArena* arena = nullptr;
    void* block = nullptr;   // the allocation; null until the first forward
    float* state = nullptr;  // its slot-aligned start
    DeviceSequence() = default;
    DeviceSequence(const DeviceSequence&) = delete;
    DeviceSequence& operator=(const DeviceSequence&) = delete;
    ~DeviceSequence() {
        if (block != nullptr)
            arena->free(block);
    }
};

namespace gpu {

// The rows of a KvPool on the device: capacity pages of page_floats floats, allocated at once.
class CudaKvStore final : public KvStore {
public:
    CudaKvStore(const KvLayout& layout, cu::DeviceArena& arena)
        : arena_(arena), capacity_(layout.capacity), offset_(layout.width.size(), 0) {
        HYMOE_CHECK(layout.dtype == DType::f32, "device KV pages are fp32");
        for (size_t l = 0; l < layout.width.size(); ++l) {
            offset_[l] = page_floats_;
            page_floats_ += layout.layer_page_floats(static_cast<int>(l));
        }
        if (capacity_ * page_floats_ > 0)
            pages_ = static_cast<float*>(
                arena_.allocate(static_cast<size_t>(capacity_ * page_floats_) * sizeof(float)));
    }
    ~CudaKvStore() override {
        if (pages_ != nullptr)
            arena_.free(pages_);
    }
    CudaKvStore(const CudaKvStore&) = delete;
    CudaKvStore& operator=(const CudaKvStore&) = delete;

    void grow(int64_t n) override {
        HYMOE_CHECK(n <= capacity_, "device KV pages: page ", n, " of ", capacity_);
    }
    void* page(int layer, int32_t page, bool) override {
        HYMOE_FAIL_ONE(Exit::internal,
                       "KvPool: page ",
                       page,
                       " of layer ",
                       layer,
                       " lives on the GPU; only the GPU model reads it");
    }
    int64_t peak_resident_bytes() const override { return 0; }  // no host memory

    cu::DeviceArena& arena() const { return arena_; }
    float* pages() const { return pages_; }
    int64_t page_floats() const { return page_floats_; }
    const std::vector<int64_t>& offsets() const { return offset_; }

private:
    cu::DeviceArena& arena_;
    int64_t capacity_ = 0, page_floats_ = 0;
    std::vector<int64_t> offset_;  // [n_layer] a layer's first float in a page
    float* pages_ = nullptr;
};

// The whole model on one GPU (or its ep shard: the routed experts it hosts).
class CudaModel final : public DeviceModel {
public:
    CudaModel(const Model& host, const CudaModelOptions& o);
    SequenceState new_sequence() override;
    std::unique_ptr<KvStore> kv_store(const KvLayout& layout) override {
        return std::make_unique<CudaKvStore>(layout, g_->arena);
    }
    int64_t kv_page_budget(int64_t page_bytes) const override;
    std::unique_ptr<KvStore> host_kv_store(const KvLayout& layout) override {
        return std::make_unique<HostKvStore>(layout, *g_);
    }
    std::unique_ptr<KvStore> file_kv_store(const KvLayout& layout, int fd) override {
        return std::make_unique<HostKvStore>(layout, *g_, fd);
    }
    int64_t host_kv_page_budget(int64_t page_bytes, int64_t host_bytes) const override;
    void forward(const std::vector<int64_t>& tokens,
                 const SeqBatch& batch,
                 const std::vector<SequenceState*>& states,
                 Buffer& logits,
                 const ForwardOptions& options,
                 TopLogits* top) override;
    void encode_images(const std::vector<VisionImage>& images,
                       int pool,
                       Tensor& out,
                       VisionStats* stats) override;
    void set_lora_adapters(const Model& host) override;
    Buffer save_kda_states(const SequenceState& s) override;
    void load_kda_states(const Buffer& saved, SequenceState& s) override;
    std::string describe() const override;
    DecodeGraphCounters graph_counters() const {
        return graphs_ ? graphs_->counters() : DecodeGraphCounters{};
    }
    void set_graphs(bool on) { graph_model_.graphs = on && o_.graphs; }

private:
    // Every sequence made by new_sequence() and given rows.
    void check_sequences(const SeqBatch& batch, const std::vector<SequenceState*>& states) const;
    StepBatch make_step(Scratch& s,
                        const SeqBatch& batch,
                        const std::vector<SequenceState*>& states);
    // Layer i's uploaded routed experts against the ones the shard hosts (all E at ep = 1).
    void check_experts(const Model& host, int i) const;
    // The sequence's KDA block (its layer-0 S), made and zeroed by the first call.
    float* kda_state_of(DeviceSequence& ds);
    // The model's one forward's view of this one (model_on.h): its weights on the device.
    ModelOn on() const { return ModelOn{shell_, ctx_, views_, o_.dtype, o_.fused, o_.ep_overlap}; }
    // The step as a decode graph (device_decode_graphs.h) when it qualifies
    // (decode_graph_plan.h); false: it did not run.
    bool forward_graph(const std::vector<int64_t>& tokens,
                       const SeqBatch& batch,
                       const std::vector<SequenceState*>& states,
                       Buffer& logits,
                       const ForwardOptions& options,
                       TopLogits* top);
    // Floats a step's row holds at the widest point of a block (inputs, outputs, their casts).
    int64_t row_floats() const;
    // Bytes the fused blocks' own buffers take in a step of `rows` rows (one block's at a time).
    int64_t fused_bytes(int64_t rows) const;
    // The decode graphs' rules for this model and, when its decode steps can qualify, their
    // runner (workspace, logits buffer, padding).
    void make_graphs();
    // Bytes one step of max_tokens rows may hold at once (activations, scores, the fused
    // blocks' buffers, logits).
    int64_t step_bytes() const;
    // Device bytes left for KV pages: next to the weights, max_seqs KDA states and one step.
    int64_t kv_room() const;
    // Floats of one sequence's KDA block: its layers' S and tails, and room to align S to a slot.
    int64_t sequence_floats() const {
        return n_kda_ == 0 ? 0 : n_kda_ * (s_floats_ + tail_floats_) + (kda_slots_ ? s_floats_ : 0);
    }

    ModelConfig cfg_;
    CudaModelOptions o_;  // graphs off under pp and tp (a step holds collectives or a part)
    ModelShard shard_;    // the stage's layers [first_layer, end_layer)
    const parallel::Comms* comms_ = nullptr;  // the grid's groups (null: one rank)
    Model shell_;  // the host model's config, shard and comms without its weights (ModelOn::m)
    std::unique_ptr<Gpu> g_;
    backend::Ctx ctx_;       // g_'s
    ModelViews views_;       // the rank's part of the model on the device (model_views.h over the
                             //   uploaded weights), each MoE layer's as moe_views_of(moe_[i])
    std::vector<MoeW> moe_;  // [n_layer] the GPU MoE's weights of the MoE layers
    std::unique_ptr<DeviceVision> vision_;  // the vision tower (cfg.vision.present)
    std::vector<int> kda_index_;  // [n_layer] the layer's rank among the stage's KDA layers, −1
                                  //   otherwise
    int n_kda_ = 0;
    int first_attention_ = -1;  // the stage's first MLA/DSA layer, −1 when none
    int64_t s_floats_ = 0;      // one KDA layer's S of one sequence: H·K·K
    int64_t tail_floats_ = 0;   // one KDA layer's conv tails of one sequence: 3·(W−1)·D
    bool kda_slots_ = false;    // the arena's S slots fit int32 (the fused kernels' slot ids)
    size_t weight_bytes_ = 0;
    int n_adapters_ = 0;  // LoRA adapters held (set_lora_adapters)
    DecodeGraphModel graph_model_;
    std::unique_ptr<DecodeGraphRunner> graphs_;  // null when no decode step can qualify
};

}  // namespace gpu

}  // namespace hymoe::model
