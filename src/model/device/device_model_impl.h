// The model on a device's class (model/device_model.h make_device_model), private to
// src/model/device/: the KDA block of a sequence, the KV store of pages on the device, and
// DeviceModelOn, whose parts live in three files: device_model.cpp (weights, memory budgets,
// adapters, images, the factory), device_step.cpp (a step's packed batch on the device) and
// device_forward.cpp (the forward, eager or as a decode graph). The same code on a GPU's Ctx and on
// the CPU's; the GPU's decode graphs and host KV tier are src/model/cuda/ (device_runtime.h).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "device_runtime.h"
#include "device_vision.h"
#include "hymoe/backend/owned_ctx.h"
#include "hymoe/core/error.h"
#include "hymoe/model/device_model.h"

namespace hymoe::model {

// A sequence's KDA states on the device: S [n_kda_layers, H, K, K] fp32, then the conv tails
// [n_kda_layers, 3, W−1, D] (planes q, k, v: model::KdaStateViews' tails), made and zeroed by the
// first forward that sees the sequence. On a GPU, S starts at a multiple of H·K·K floats from the
// arena's base, so that each layer's S is a slot of one pool there (the fused kernels'
// addressing, cuda_fused.h KdaBatchParams).
struct DeviceSequence {
    const void* owner = nullptr;  // the model that made it
    backend::Held block;          // the allocation; empty until the first forward
    float* state = nullptr;       // its slot-aligned start
};

namespace dev {

// The rows of a KvPool on the model's device: capacity pages of page_floats floats, allocated at
// once. On the CPU a page is readable between forwards (KvStore::page); on a GPU only the
// model reads them.
class PagedKvStore final : public KvStore {
public:
    PagedKvStore(const KvLayout& layout, const backend::Ctx& ctx)
        : ctx_(ctx), capacity_(layout.capacity), offset_(layout.width.size(), 0) {
        HYMOE_CHECK(layout.dtype == DType::f32, "device KV pages are fp32");
        for (size_t l = 0; l < layout.width.size(); ++l) {
            offset_[l] = page_floats_;
            page_floats_ += layout.layer_page_floats(static_cast<int>(l));
        }
        if (capacity_ * page_floats_ > 0)
            pages_ = backend::Held(ctx, DType::f32, {capacity_ * page_floats_});
    }

    void grow(int64_t n) override {
        HYMOE_CHECK(n <= capacity_, "device KV pages: page ", n, " of ", capacity_);
    }
    void* page(int layer, int32_t page, bool) override {
        if (ctx_.device != Device::cpu)
            HYMOE_FAIL_ONE(Exit::internal,
                           "KvPool: page ",
                           page,
                           " of layer ",
                           layer,
                           " lives on the GPU; only the GPU model reads it");
        return pages() + page * page_floats_ + offset_[static_cast<size_t>(layer)];
    }
    int64_t peak_resident_bytes() const override { return 0; }  // the model's memory

    bool on(const backend::Ctx& ctx) const { return &ctx == &ctx_; }
    float* pages() const { return static_cast<float*>(pages_.view().data); }
    int64_t page_floats() const { return page_floats_; }
    const std::vector<int64_t>& offsets() const { return offset_; }

private:
    const backend::Ctx& ctx_;
    int64_t capacity_ = 0, page_floats_ = 0;
    std::vector<int64_t> offset_;  // [n_layer] a layer's first float in a page
    backend::Held pages_;          // f32 [capacity · page_floats]
};

// The rank's part of the model on its device (its ep shard: the routed experts it hosts).
class DeviceModelOn final : public DeviceModel {
public:
    DeviceModelOn(const Model& host, const DeviceModelOptions& o);
    SequenceState new_sequence() override;
    std::unique_ptr<KvStore> kv_store(const KvLayout& layout) override {
        return std::make_unique<PagedKvStore>(layout, ctx());
    }
    int64_t kv_page_budget(int64_t page_bytes) const override;
    std::unique_ptr<KvStore> host_kv_store(const KvLayout& layout) override;
    std::unique_ptr<KvStore> file_kv_store(const KvLayout& layout, int fd) override;
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
    void place_experts(const Model& host, int layer) override;
    Buffer save_kda_states(const SequenceState& s) override;
    void load_kda_states(const Buffer& saved, SequenceState& s) override;
    std::string describe() const override;
    DecodeGraphCounters graph_counters() const override {
        return graphs_ ? graphs_->counters() : DecodeGraphCounters{};
    }
    void set_graphs(bool on) override { graph_model_.graphs = on && o_.graphs; }

private:
    const backend::Ctx& ctx() const { return owned_->ctx(); }
    // Every sequence made by new_sequence() and given rows.
    void check_sequences(const SeqBatch& batch, const std::vector<SequenceState*>& states) const;
    StepBatch make_step(backend::Scratch& s,
                        const SeqBatch& batch,
                        const std::vector<SequenceState*>& states);
    // Layer i's uploaded routed experts against the ones the shard hosts (all E at ep = 1).
    void check_experts(const Model& host, int i) const;
    // The sequence's KDA block (its layer-0 S), made and zeroed by the first call.
    float* kda_state_of(DeviceSequence& ds);
    // The model's one forward's view of this one (model_on.h): its weights on the device.
    ModelOn on() const { return ModelOn{shell_, ctx(), views_, o_.dtype, o_.fused, o_.ep_overlap}; }
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
    DeviceModelOptions o_;  // graphs off under pp and tp (a step holds collectives or a part)
    ModelShard shard_;      // the stage's layers [first_layer, end_layer)
    const parallel::Comms* comms_ = nullptr;  // the grid's groups (null: one rank)
    Model shell_;  // the host model's config, shard and comms without its weights (ModelOn::m)
    std::unique_ptr<backend::OwnedCtx> owned_;  // the device's context and arena
    int n_sm_ = 0;                              // its multiprocessors (0 on the CPU)
    Keep keep_;                                 // the weights and adapters on the device
    ModelViews views_;       // the rank's part of the model on the device (model_views.h over the
                             //   uploaded weights), each MoE layer's as moe_views_of(moe_[i])
    std::vector<MoeW> moe_;  // [n_layer] the MoE layers' device weights and host routing side
    std::unique_ptr<DeviceVision> vision_;  // the vision tower (cfg.vision.present)
    std::vector<int> kda_index_;  // [n_layer] the layer's rank among the stage's KDA layers, −1
                                  //   otherwise
    int n_kda_ = 0;
    int first_attention_ = -1;  // the stage's first MLA/DSA layer, −1 when none
    int64_t s_floats_ = 0;      // one KDA layer's S of one sequence: H·K·K
    int64_t tail_floats_ = 0;   // one KDA layer's conv tails of one sequence: 3·(W−1)·D
    bool kda_slots_ = false;    // a GPU arena whose S slots fit int32 (the fused kernels' ids)
    size_t weight_bytes_ = 0;
    int n_adapters_ = 0;  // LoRA adapters held (set_lora_adapters)
    DecodeGraphModel graph_model_;
    std::unique_ptr<DecodeGraphs> graphs_;  // null when no decode step can qualify
};

}  // namespace dev

}  // namespace hymoe::model
