// The GPU model's private pieces (src/model/cuda/*.cpp, CUDA builds only): the device with its
// stream, arena and cuBLAS handle; scratch tensors for one block; the upload of the weight list
// (the layers run on model/model_views.h's views of it) and the GPU MoE's MoeW; one step's packed
// batch on the device (offsets, positions, block tables, the KDA state of every sequence) and the
// step as the one forward's StepStates (CudaStep). The blocks themselves are the CPU's (the one
// forward, src/model/forward.cpp and layer.cpp) on the device's Ctx; matrices are in the model's
// compute dtype `cd` (bf16 or f32).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "../layer.h"
#include "../moe_grouped.h"
#include "device_lora.h"
#include "hymoe/backend/cuda_arena.h"
#include "hymoe/backend/cuda_gemm.h"
#include "hymoe/backend/cuda_model_ops.h"
#include "hymoe/backend/ops_mla.h"
#include "hymoe/backend/scratch_stand_in.h"
#include "hymoe/backend/stack_alloc.h"
#include "hymoe/model/attention.h"
#include "hymoe/model/attention_views.h"
#include "hymoe/model/config.h"
#include "hymoe/model/ffn.h"
#include "hymoe/model/fused_step.h"
#include "hymoe/model/kda_views.h"
#include "hymoe/model/model.h"
#include "hymoe/model/model_views.h"
#include "hymoe/model/moe_parallel.h"
#include "hymoe/model/moe_views.h"

namespace hymoe::model::gpu {

namespace cu = backend::cuda;

// The device: one stream, one arena (everything the model holds or computes lives in it) and a
// cuBLAS handle on the stream. Members are destroyed in reverse: the handle gives its workspace
// back to the arena before the arena goes.
struct Gpu {
    cu::Stream stream;
    cu::DeviceArena arena;
    cu::Blas blas;
    Gpu(size_t arena_bytes, int max_groups) : arena(arena_bytes), blas(stream, arena, max_groups) {}
};

// The device's context for the backend-neutral ops and model blocks (backend/ctx.h).
inline backend::Ctx ctx_of(Gpu& g) {
    return backend::Ctx{Device::cuda, &g.stream, &g.arena, &g.blas};
}

// Scratch memory at fixed device addresses for the steps the decode graphs capture
// (device_decode_graphs.h): while a WorkspaceScope is alive on this thread, every Scratch of
// `arena`, and every backend::Scratch of a Ctx on it (backend/scratch_stand_in.h), takes its
// tensors from the workspace's stack instead of the arena and gives them back last-in first-out,
// so that a step queued twice gets the same addresses; a release out of order aborts with its
// message (a destructor cannot throw).
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
    // The stand-in for `arena` on this thread now, or null.
    static backend::ScratchStandIn* active(const cu::DeviceArena& arena) {
        return backend::ScratchStandIn::active(&arena);
    }

private:
    backend::StandInScope scope_;
};

// Tensors for one block call, freed together (in reverse) when it goes out of scope. The frees do
// not wait for the GPU: a later allocation of the same memory is used by kernels queued after
// every kernel that used it before (one stream).
class Scratch {
public:
    explicit Scratch(cu::DeviceArena& arena)
        : arena_(arena), workspace_(WorkspaceScope::active(arena)) {}
    ~Scratch() {
        for (auto p = held_.rbegin(); p != held_.rend(); ++p)
            if (workspace_)
                workspace_->release(*p);
            else
                arena_.free(*p);
    }
    Scratch(const Scratch&) = delete;
    Scratch& operator=(const Scratch&) = delete;
    Tensor operator()(DType dtype, Shape shape) {
        Tensor t = workspace_ ? workspace_->tensor(dtype, std::move(shape))
                              : arena_.tensor(dtype, std::move(shape));
        held_.push_back(t.data);
        return t;
    }

private:
    cu::DeviceArena& arena_;
    backend::ScratchStandIn* workspace_;
    std::vector<void*> held_;
};

// The most attention scores one group of the attention holds (backend/ops_mla.h), 256 MiB; the
// decode graphs' workspace keeps room for it.
constexpr int64_t kScoreFloats = ops::kMlaScoreFloats;

// `elements` elements into t's storage (sub-blocks of a row-major tensor for strided GEMMs).
inline void* at(const Tensor& t, int64_t elements) {
    return static_cast<char*>(t.data) + elements * static_cast<int64_t>(dtype_size(t.dtype));
}
// x itself when it is already of dtype `cd`, else a cast copy in s.
Tensor in_dtype(Gpu& g, Scratch& s, const Tensor& x, DType cd);
// A device copy of host values in s (synchronous on the host side: v may go right after).
template <class T>
Tensor upload_values(Gpu& g, Scratch& s, const std::vector<T>& v, DType dtype) {
    Tensor t = s(dtype, {static_cast<int64_t>(v.size())});
    cu::copy_to_device(t.data, v.data(), v.size() * sizeof(T), g.stream);
    return t;
}

// ---- device weights (device_weights.cpp) --------------------------------------------------------

// The model's weights on the device (model/model_views.h): every tensor of the host model's
// weight list but the vision tower's (DeviceVision uploads that), by name, uploaded once into
// permanent arena memory at the list's shape, in the dtype of its kind: the stored matrices
// (weights.h stored_matrix: projections, experts, embedding, head) in the compute dtype `cd`
// (widened from the host's storage dtype, then rounded to bf16, to nearest even, when cd is
// bf16), everything else (norms, conv taps, A_log, dt_bias, the router and its bias) in fp32.
// The routed experts' matrices of a layer are stacked on the way into one [E_held, out, in]
// tensor each, held experts in the list's order (ids ascending), one grouped GEMM reading them:
// each expert's name names its slice. model_views(host, upload_weights(...)) are the layers'
// views.
NamedTensors upload_weights(Gpu& g, const Model& host, DType cd);

// The MLPs of MoeW's shared experts: model::dense_ffn_forward's views (model/ffn_views.h).
using MlpW = DenseFfnViews;
// The MoE layer: model::moe_forward_parallel's views (model/moe_views.h; router f32, fc1, fc2 and
// the experts in cd, experts.* the held experts' slices [E_held] of gate, up, down, their adapters
// as lora_views, shared the shared experts) with the stacked matrices those slices are (the grouped
// and fused expert ops read each list as one) and the host side of the routing.
struct MoeW : MoeWeightViews {
    Tensor gate;      // [E, I, w] cd (swiglu); ep > 1: the hosted experts [E_local, I, w]
    Tensor up;        // [E, I, w] cd
    Tensor down;      // [E, w, I] cd
    MoeWeights host;  // the correction bias and the placement alone (host routing, ep dispatch)
};
// An MoE layer's MoeW over its views (upload_weights' device tensors: the stacked experts and
// their slices, the router, bias, latent projections and shared experts) and, from the host
// layer, the placement and the correction bias for the host routing.
MoeW moe_weights(const MoeWeightViews& v, const MoeWeights& host);

// A host matrix or vector uploaded as `dtype` (f32 or bf16) at its shape from the weight list
// (model/tensor_list.h), or viewed as `shape` (as many elements), in permanent arena memory.
Tensor upload_weight(Gpu& g, const Buffer& host, DType dtype);
Tensor upload_weight(Gpu& g, const Buffer& host, Shape shape, DType dtype);

// ---- one step on the device (device_step.cpp fills it) ------------------------------------------

class HostKvStore;  // the host tier of the KV pages (device_kv_offload.h)

struct StepBatch {
    const SeqBatch* batch = nullptr;
    int64_t n_tok = 0, n_seq = 0;
    Tensor offsets;     // i64 [n_seq + 1]
    Tensor row_seq;     // i32 [n_tok] sequence of each row
    Tensor positions;   // i64 [n_tok] absolute position of each row
    Tensor visible;     // i32 [n_tok] keys each row sees: its position + 1 (its own included)
    int64_t n_kda = 0;  // the model's KDA layers
    Tensor kda_states;  // float* [4, n_kda_layers, n_seq] each sequence's layer S, then its
                        //   q, k and v conv tails
    // The same S as slots of a pool for the fused kernels (cuda_fused.h KdaBatchParams): layer
    // state j of sequence q is kda_pool + kda_slots[j, q]·H·K·K; null pool: no slots (the
    // arena is too large for int32 slots).
    float* kda_pool = nullptr;
    Tensor kda_slots;    // i32 [n_kda_layers, n_seq]
    bool fused = false;  // the fused kernels where they apply (CudaModelOptions::fused)
    // The paged cache: the pool's device pages and the sequences' block tables.
    float* pages = nullptr;   // page 0, layer 0 of the pool's store
    int64_t page_stride = 0;  // floats a page (all layers)
    int page_tokens = 0;
    std::vector<int64_t> layer_offset;  // [n_layer] a layer's first float in a page
    std::vector<int64_t> row_width;     // [n_layer] floats a token in that layer
    Tensor block_table;                 // i32 [n_seq, max_pages]
    int max_pages = 0;
    // The sequences with a single row this step (decode), attended in one paged launch.
    int64_t n_one = 0;
    Tensor one_rows;   // i64 [n_one] their rows
    Tensor one_table;  // i32 [n_one, max_pages] their block tables
    Tensor one_keys;   // i32 [n_one] their keys after the step (the query's own included)
    int64_t one_max_keys = 0;
    // The pool's host tier, whose slots `pages` points into (block tables in slot indices);
    // null: the pages are all on the device.
    HostKvStore* host_kv = nullptr;
    LoraStep lora;  // the rows of each LoRA adapter the step uses (device_lora.h)

    cu::KvPages pages_of(int layer) const {
        return {pages + layer_offset[layer],
                page_stride,
                row_width[layer],
                page_tokens,
                block_table.ptr<int32_t>(),
                max_pages};
    }
};

// ---- the blocks
// ----------------------------------------------------------------------------------

// Layer j's view of the step for model::kda_forward (j: the layer's rank among the model's KDA
// layers): the step's offsets and rows, its rows of kda_states and, with step.fused and a pool,
// of kda_slots (so the CUDA backend may run its fused kernels), and the step's adapter rows.
KdaBatchViews kda_batch(const StepBatch& step, int j);

// A step's sequences as the one forward's StepStates (src/model/layer.h) see them on the device:
// each KDA layer's rows of the step's state table (kda_batch), each attention layer's pages and
// rows on the device (DeviceAttnRows; the fused DSA kernels where the step and its sizes allow:
// model/fused_step.h), awaited and released on the host tier; the step's adapter rows; at the
// end, the sequences' caches advanced by their rows (states null: a decode graph's step, which
// its runner advances).
class CudaStep final : public detail::StepStates {
public:
    // kda_index: [n_layer] each layer's rank among the stage's KDA layers; cd: the matrices'.
    CudaStep(const ModelConfig& cfg,
             const ModelShard& shard,
             const std::vector<int>& kda_index,
             const StepBatch& step,
             DType cd,
             const std::vector<SequenceState*>* states);
    KdaBatchViews kda(int i) override { return kda_batch(step_, kda_index_[i]); }
    Attention attention(int i) override;
    void leave_attention(int i) override;
    const std::vector<LoraRowsView>* lora_rows() const override {
        return step_.lora.rows.empty() ? nullptr : &step_.lora.rows;
    }
    const SeqBatch* ffn_rows() const override { return has_rows_ ? &rows_ : nullptr; }
    void end_step() override;

private:
    const ModelConfig& cfg_;
    const ModelShard& shard_;
    const std::vector<int>& kda_index_;
    const StepBatch& step_;
    DType cd_;
    const std::vector<SequenceState*>* states_;
    SeqBatch rows_;  // each row's adapter (a sequence a row) for the FFNs, when has_rows_
    bool has_rows_ = false;
    DsaFusedPlan fused_;  // the last attention layer's fused DSA plans, which dev_ points to
    DeviceAttnRows dev_;  // the last attention layer's rows
};

// Each sequence's attention caches (the stage's attention layers) advanced by its rows: a device
// step's rows are appended on the device, so attention_forward leaves the counts to its caller.
void advance_caches(const ModelConfig& cfg,
                    const ModelShard& shard,
                    const SeqBatch& batch,
                    const std::vector<SequenceState*>& states);

// w's views for model::moe_forward_parallel with the experts' inputs in cd (device_weights.cpp);
// over an ep group (ep: non-null) the held experts' slices are looked up by local index
// (expert_slot).
MoeWeightViews moe_views_of(const MoeW& w, DType cd, int64_t n_exp, const comm::Comm* ep);

}  // namespace hymoe::model::gpu
