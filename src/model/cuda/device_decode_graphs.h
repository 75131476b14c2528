// Decode steps of the GPU model replayed as CUDA graphs (model/cuda_model.h
// CudaModelOptions::graphs; which steps qualify, the buckets and the metadata packing are the
// plain C++ of model/decode_graph_plan.h). A step of n sequences runs the graph of (B, key
// bucket), B = the batch bucket of n; the graph is the model's own step function (the embedding,
// the layers shared with the eager forward, the final norm and head) captured once per key:
//   - before the launch, ONE asynchronous copy from a pinned staging block fills the graph's fixed
//     device metadata (token ids, positions, offsets, row map, block tables max_pages wide,
//     one-row keys, KDA state pointers and slots); padded rows read a dummy sequence: token 0 at
//     position 0, one key in a reserved KV page, a scratch KDA state zeroed at each step's start;
//   - the step's scratch comes from one workspace at fixed addresses that every graph shares (one
//     replays at a time on the stream), through a LIFO stack (device_blocks.h Workspace);
//   - logits land in a fixed [max batch, V] buffer, of which the caller downloads the n real rows
//     (or their top tokens).
// The first use of a (B, key bucket) runs the step once eagerly on padding alone (one-time
// setup outside the capture: cuBLAS state, kernel attributes), then captures it (DecodeGraphs).
// A graph bakes in the KV store's page base: a step over another store with the same page
// geometry re-captures every graph and updates it in place (DecodeGraphs::refresh); another
// geometry drops the graphs, to be captured again on use.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "device_blocks.h"
#include "hymoe/backend/cuda_graph.h"
#include "hymoe/model/cuda_model.h"
#include "hymoe/model/decode_graph_plan.h"

namespace hymoe::model::gpu {

// The pages of a KV store as a step addresses them (cuda_model_impl.h CudaKvStore).
struct KvGeometry {
    float* pages = nullptr;  // page 0, layer 0
    int64_t page_floats = 0;
    int page_tokens = 0;
    std::vector<int64_t> layer_offset;  // [n_layer] a layer's first float in a page
    std::vector<int64_t> row_width;     // [n_layer] floats a token in that layer
    bool same_shape(const KvGeometry& o) const {
        return page_floats == o.page_floats && page_tokens == o.page_tokens &&
               layer_offset == o.layer_offset && row_width == o.row_width;
    }
};

// A block of arena memory, given back when its owner goes.
class ArenaBlock {
public:
    ArenaBlock() = default;
    ArenaBlock(cu::DeviceArena& arena, size_t bytes)
        : arena_(&arena), data_(static_cast<char*>(arena.allocate(bytes))) {}
    ~ArenaBlock() {
        if (data_ != nullptr)
            arena_->free(data_);
    }
    ArenaBlock(ArenaBlock&& o) noexcept
        : arena_(o.arena_), data_(std::exchange(o.data_, nullptr)) {}
    ArenaBlock& operator=(ArenaBlock&& o) noexcept {
        std::swap(arena_, o.arena_);
        std::swap(data_, o.data_);
        return *this;
    }
    char* data() const { return data_; }

private:
    cu::DeviceArena* arena_ = nullptr;
    char* data_ = nullptr;
};

class DecodeGraphRunner {
public:
    // step(batch, ids, logits): queue the forward of batch's rows (token ids i64 [B] on the
    // device) writing logits [B, V] f32; capture-safe once run (device_blocks.h blocks on fused
    // decode paths).
    using Step = std::function<void(const StepBatch& step, const Tensor& ids, Tensor& logits)>;
    // kda: the model's KDA blocks; kda_pool: the arena's base when KDA states are slots, else
    // null; workspace_bytes: the scratch of one step of max_batch rows.
    DecodeGraphRunner(Gpu& g,
                      int max_batch,
                      int64_t vocab,
                      size_t workspace_bytes,
                      const KdaBlockShape& kda,
                      float* kda_pool,
                      Step step);
    DecodeGraphRunner(const DecodeGraphRunner&) = delete;
    DecodeGraphRunner& operator=(const DecodeGraphRunner&) = delete;

    const cu::DecodeBuckets& buckets() const { return buckets_; }
    // Queues one decode step: rows (1 ≤ n ≤ max batch) over the pages of kv (null: no attention
    // layer). Returns the real rows' logits [n, V] f32 on the device, valid until the next run;
    // the caller synchronises the stream before that (the metadata's staging is reused).
    Tensor run(const std::vector<DecodeRow>& rows, const KvGeometry* kv);
    const DecodeGraphCounters& counters() const { return counters_; }

private:
    // The graph of one (B, key bucket): its fixed metadata and the host staging of its copy.
    struct Graph {
        DecodeMetaLayout layout;
        int64_t key_bucket = 0;
        ArenaBlock meta;                         // device [layout.bytes]
        std::unique_ptr<cu::PinnedBuffer> host;  // its staging
        // the blocks' host view: B sequences of one row, each at position key_bucket − 1 (the
        // most keys a row of the graph may see: what the DSA plan is sized for)
        SeqBatch padded;
    };
    Graph& graph(int bucket, int64_t key_bucket);
    cu::DecodeGraphs& graphs(int64_t key_bucket);
    void follow_store(const KvGeometry& kv);
    void upload(Graph& gr, const std::vector<DecodeRow>& rows);
    StepBatch step_of(const Graph& gr) const;
    void queue(const Graph& gr);

    Gpu& g_;
    cu::DecodeBuckets buckets_;
    int64_t vocab_;
    KdaBlockShape kda_;
    float* kda_pool_;
    Step step_;
    ArenaBlock workspace_block_;
    Workspace workspace_;
    ArenaBlock logits_block_;
    Tensor logits_;  // [max batch, V] f32 in logits_block_
    ArenaBlock pad_state_;
    ArenaBlock pad_page_;  // room for one page of the current store at a whole page index
    DecodePadding pad_;
    std::unique_ptr<KvGeometry> kv_;  // the store the graphs address, null before the first
    std::map<std::pair<int, int64_t>, Graph> graph_;               // (B, key bucket)
    std::map<int64_t, std::unique_ptr<cu::DecodeGraphs>> graphs_;  // key bucket
    DecodeGraphCounters counters_;
};

}  // namespace hymoe::model::gpu
