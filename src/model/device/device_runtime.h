// The host runtime of the model on a device (model/device_model.h make_device_model), private to
// src/model/device/, the same code on any Ctx (a GPU's, or the CPU's, where the tests hold it to
// model::forward): the weight list uploaded once (the layers run on model/model_views.h's views
// of it) and the MoE's MoeW; one step's packed batch on the device (offsets, positions, block
// tables, the KDA state of every sequence) and the step as the one forward's StepStates
// (TableStep). The blocks themselves are the one forward's (src/model/forward.cpp and
// layer.cpp) on the device's Ctx; matrices are in the model's compute dtype `cd` (bf16 or f32).
// The GPU's own parts (decode graphs, the host KV tier) are src/model/cuda/, reached through
// the interfaces at the end.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "../layer.h"
#include "../moe_grouped.h"
#include "device_lora.h"
#include "hymoe/backend/cuda_graph.h"
#include "hymoe/backend/held.h"
#include "hymoe/backend/ops_attention.h"
#include "hymoe/backend/ops_mla.h"
#include "hymoe/model/attention.h"
#include "hymoe/model/attention_views.h"
#include "hymoe/model/config.h"
#include "hymoe/model/decode_graph_plan.h"
#include "hymoe/model/device_model.h"
#include "hymoe/model/ffn.h"
#include "hymoe/model/fused_step.h"
#include "hymoe/model/kda_views.h"
#include "hymoe/model/model.h"
#include "hymoe/model/model_views.h"
#include "hymoe/model/moe_parallel.h"
#include "hymoe/model/moe_views.h"

namespace hymoe::model::dev {

// The tensors a model on a device keeps for good (weights, adapters), on its Ctx.
using Keep = std::vector<backend::Held>;
// Bytes of the tensors keep holds.
inline size_t kept_bytes(const Keep& keep) {
    size_t n = 0;
    for (const backend::Held& t : keep)
        n += t.view().bytes();
    return n;
}

// The most attention scores one group of the attention holds (backend/ops_mla.h), 256 MiB; the
// decode graphs' workspace keeps room for it.
constexpr int64_t kScoreFloats = ops::kMlaScoreFloats;

// `elements` elements into t's storage (sub-blocks of a row-major tensor for strided GEMMs).
inline void* at(const Tensor& t, int64_t elements) {
    return static_cast<char*>(t.data) + elements * static_cast<int64_t>(dtype_size(t.dtype));
}
// A copy of host values on ctx's device in s, the copy queued from a host copy of them that
// `staged` keeps (v may go right after; staged must live until the stream has run the copy).
template <class T>
Tensor upload_values(const backend::Ctx& ctx,
                     backend::Scratch& s,
                     std::vector<Buffer>& staged,
                     const std::vector<T>& v,
                     DType dtype) {
    const Shape shape{static_cast<int64_t>(v.size())};
    Tensor t = s(dtype, shape);
    if (v.empty())
        return t;
    Buffer& host = staged.emplace_back(dtype, shape, uninit);
    std::copy(v.begin(), v.end(), host.ptr<T>());
    ops::upload(ctx, host.view(), t);
    return t;
}

// ---- device weights (device_weights.cpp) --------------------------------------------------------

// The model's weights on the device (model/model_views.h): every tensor of the host model's
// weight list but the vision tower's (DeviceVision uploads that), by name, uploaded once into
// tensors kept in `keep`, at the list's shape, in the dtype of its kind: the stored matrices
// (weights.h stored_matrix: projections, experts, embedding, head) in the compute dtype `cd`
// (widened from the host's storage dtype, then rounded to bf16, to nearest even, when cd is
// bf16), everything else (norms, conv taps, A_log, dt_bias, the router and its bias) in fp32.
// The routed experts' matrices of a layer are stacked on the way into one [E_held, out, in]
// tensor each, held experts in the list's order (ids ascending), one grouped GEMM reading them:
// each expert's name names its slice. model_views(host, upload_weights(...)) are the layers'
// views.
NamedTensors upload_weights(const backend::Ctx& ctx, Keep& keep, const Model& host, DType cd);

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

// The routed experts host's MoE layer hosts now (ids ascending) in w's stacked experts (as many
// as before), slot k the k-th: written where slot k held another expert than before[k] (the ids
// w's slots held), and host's placement taken (MoeW::host.expert_rank). w's slices stay where
// they are.
void replace_experts(const backend::Ctx& ctx,
                     const MoeWeights& host,
                     const std::vector<int>& before,
                     MoeW& w);

// A host matrix or vector uploaded as `dtype` (f32 or bf16) at its shape from the weight list
// (model/tensor_list.h), kept in `keep`.
Tensor upload_weight(const backend::Ctx& ctx, Keep& keep, const Buffer& host, DType dtype);

// ---- one step on the device (device_step.cpp fills it) ------------------------------------------

class KvTier;  // a KV store's host tier (below)

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
    bool fused = false;  // the fused kernels where they apply (DeviceModelOptions::fused)
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
    KvTier* host_kv = nullptr;
    LoraStep lora;  // the rows of each LoRA adapter the step uses (device_lora.h)
    // The host copies the tables above were uploaded from (upload_values), kept until the step
    // ends: its last download waits for the stream, so every copy has read them by then.
    std::vector<Buffer> staged;
};

// ---- the step as the one forward sees it (device_step.cpp) --------------------------------------

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
class TableStep final : public detail::StepStates {
public:
    // kda_index: [n_layer] each layer's rank among the stage's KDA layers; cd: the matrices';
    // n_sm: the GPU's multiprocessors, which size the fused DSA plans (0: no fused DSA).
    TableStep(const ModelConfig& cfg,
              const ModelShard& shard,
              const std::vector<int>& kda_index,
              const StepBatch& step,
              DType cd,
              int n_sm,
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
    int n_sm_;
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

// ---- the GPU's own parts (src/model/cuda/, CUDA builds only) ------------------------------------

// A KV store whose rows live on the host, staged into slots on the device a step's attention
// layer at a time (src/model/cuda/device_kv_offload.h): the step's calls, in order.
class KvTier {
public:
    virtual ~KvTier() = default;
    // Whether the store stages into the arena of ctx (the model's own).
    virtual bool on(const backend::Ctx& ctx) const = 0;
    // The step's block tables table [n_seq, max_pages] (pool pages) become slot indices; step's
    // pages, page_stride, layer_offset and host_kv point at the slots.
    virtual void stage_step(const SeqBatch& batch,
                            std::vector<int32_t>& table,
                            StepBatch& step) = 0;
    virtual void await_layer(int layer) = 0;    // before the attention block of `layer`
    virtual void release_layer(int layer) = 0;  // after it
    virtual void finish_step() = 0;             // after the last layer
};
// The host tier's store of `layout` on ctx (a CUDA one): pinned host rows (fd < 0) or the spill
// file fd's (owned); a KvStore that is also a KvTier.
std::unique_ptr<KvStore> make_host_kv_store(const KvLayout& layout,
                                            const backend::Ctx& ctx,
                                            int fd);
// Device bytes of the slots of a host-tier store with `layout`.
int64_t host_kv_slot_bytes(const KvLayout& layout);

// The pages of a KV store as a decode graph addresses them (PagedKvStore's).
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

// Pure decode steps replayed as CUDA graphs (src/model/cuda/device_decode_graphs.h).
class DecodeGraphs {
public:
    // step(batch, ids, logits): queue the forward of batch's rows (token ids i64 [B] on the
    // device) writing logits [B, V] f32; capture-safe once run.
    using Step = std::function<void(const StepBatch& step, const Tensor& ids, Tensor& logits)>;
    virtual ~DecodeGraphs() = default;
    virtual const backend::cuda::DecodeBuckets& buckets() const = 0;
    // Queues one decode step: rows (1 ≤ n ≤ max batch) over the pages of kv (null: no attention
    // layer). Returns the real rows' logits [n, V] f32 on the device, valid until the next run.
    virtual Tensor run(const std::vector<DecodeRow>& rows, const KvGeometry* kv) = 0;
    virtual const DecodeGraphCounters& counters() const = 0;
};
// The graphs of a model on ctx (a CUDA one) whose arena begins at base: kda the model's KDA
// blocks; kda_pool the arena's base when KDA states are slots, else null; workspace_bytes the
// scratch of one step of max_batch rows.
std::unique_ptr<DecodeGraphs> make_decode_graphs(const backend::Ctx& ctx,
                                                 int max_batch,
                                                 int64_t vocab,
                                                 size_t workspace_bytes,
                                                 const KdaBlockShape& kda,
                                                 float* kda_pool,
                                                 DecodeGraphs::Step step);

}  // namespace hymoe::model::dev
