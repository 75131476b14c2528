// Decode steps of the model on a GPU replayed as CUDA graphs (model/device_model.h
// DeviceModelOptions::graphs; which steps qualify, the buckets and the metadata packing are the
// plain C++ of model/decode_graph_plan.h). A step of n sequences runs the graph of (B, key
// bucket), B = the batch bucket of n; the graph is the model's own step function (the embedding,
// the layers shared with the eager forward, the final norm and head) captured once per key:
//   - before the launch, ONE asynchronous copy from a pinned staging block fills the graph's fixed
//     device metadata (token ids, positions, offsets, row map, block tables max_pages wide,
//     one-row keys, KDA state pointers and slots); padded rows read a dummy sequence: token 0 at
//     position 0, one key in a reserved KV page, a scratch KDA state zeroed at each step's start;
//   - the step's scratch comes from one workspace at fixed addresses that every graph shares (one
//     replays at a time on the stream), through a LIFO stack (Workspace, below);
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

#include "../device/device_runtime.h"
#include "hymoe/backend/cuda_arena.h"
#include "hymoe/backend/cuda_graph.h"
#include "hymoe/backend/scratch_stand_in.h"
#include "hymoe/backend/stack_alloc.h"
#include "hymoe/model/decode_graph_plan.h"

namespace hymoe::model::dev {

namespace cu = backend::cuda;

// Scratch memory at fixed device addresses for the steps the decode graphs capture: while a
// WorkspaceScope is alive on this thread, every backend::Scratch of a Ctx on `arena`
// (backend/scratch_stand_in.h) takes its tensors from the workspace's stack instead of the arena
// and gives them back last-in first-out, so that a step queued twice gets the same addresses; a
// release out of order aborts with its message (a destructor cannot throw).
struct Workspace final : backend::ScratchStandIn {
    cu::DeviceArena* arena = nullptr;  // the arena it stands in for
    char* base = nullptr;              // its device bytes [base, base + stack.capacity())
    cu::StackAllocator stack{0};
    Tensor tensor(DType dtype, Shape shape) override;
    void release(void* p) noexcept override;
};
class WorkspaceScope {
public:
    explicit WorkspaceScope(Workspace& w) : scope_(w, *w.arena) {}

private:
    backend::StandInScope scope_;
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

class DecodeGraphRunner final : public DecodeGraphs {
public:
    // As make_decode_graphs (device_runtime.h).
    DecodeGraphRunner(const backend::Ctx& ctx,
                      int max_batch,
                      int64_t vocab,
                      size_t workspace_bytes,
                      const KdaBlockShape& kda,
                      float* kda_pool,
                      Step step);
    DecodeGraphRunner(const DecodeGraphRunner&) = delete;
    DecodeGraphRunner& operator=(const DecodeGraphRunner&) = delete;

    const cu::DecodeBuckets& buckets() const override { return buckets_; }
    // The caller synchronises the stream before the next run (the metadata's staging is reused).
    Tensor run(const std::vector<DecodeRow>& rows, const KvGeometry* kv) override;
    const DecodeGraphCounters& counters() const override { return counters_; }

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

    const cu::Stream& stream_;
    cu::DeviceArena& arena_;
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

}  // namespace hymoe::model::dev
