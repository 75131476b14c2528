// The GPU model (model/cuda_model.h): the weights uploaded once, the KV pages of a pool in one
// device block (KvPool's layout: page p holds every attention layer's rows of its tokens, layer
// after layer), every sequence's KDA states in one device block made at its first forward and
// freed with it (or the pool's rows in pinned host memory, staged a layer at a time:
// device_kv_offload.h), and the forward: the step's packed batch on the device (offsets, positions,
// block tables, state pointers; one small upload each), the embedding, the layers
// (h += mixer(RMSNorm₁ h); h += ffn(RMSNorm₂ h), blocks in device_*.cpp), the final norm and the
// head, and one copy of the logits to the host (or of each row's top tokens: model::TopLogits).
// A pure decode step that qualifies (decode_graph_plan.h) replays a CUDA graph of the same
// embedding, layers and head instead (device_decode_graphs.h); the layer loop is one function
// both paths run.
#include <algorithm>
#include <limits>
#include <memory>

#include "device_blocks.h"
#include "device_decode_graphs.h"
#include "device_kv_offload.h"
#include "device_moe_ep.h"
#include "device_vision.h"
#include "hymoe/backend/cuda_ops.h"
#include "hymoe/core/error.h"
#include "hymoe/core/timer.h"
#include "hymoe/model/cuda_model.h"
#include "hymoe/model/fused_step.h"
#include "hymoe/model/moe_ep_plan.h"

namespace hymoe::model {

// A sequence's KDA states on the device: S [n_kda_layers, H, K, K] fp32, then the conv tails
// [n_kda_layers, W−1, 3D] (device_blocks.h KdaW), made and zeroed by the first forward that sees
// the sequence. S starts at a multiple of H·K·K floats from the arena's base, so that each layer's
// S is a slot of one pool there (the fused kernels' addressing, cuda_fused.h KdaBatchParams).
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

namespace {

namespace cu = backend::cuda;
using gpu::Gpu;
using gpu::Scratch;

// The rows of a KvPool on the device: capacity pages of page_floats floats, allocated at once.
class CudaKvStore final : public KvStore {
public:
    CudaKvStore(const KvLayout& layout, cu::DeviceArena& arena)
        : arena_(arena), capacity_(layout.capacity), offset_(layout.width.size(), 0) {
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
    float* page(int layer, int32_t page, bool) override {
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

class CudaModel final : public DeviceModel {
public:
    CudaModel(const Model& host, const CudaModelOptions& o);
    SequenceState new_sequence() override;
    std::unique_ptr<KvStore> kv_store(const KvLayout& layout) override {
        return std::make_unique<CudaKvStore>(layout, g_->arena);
    }
    int64_t kv_page_budget(int64_t page_bytes) const override;
    std::unique_ptr<KvStore> host_kv_store(const KvLayout& layout) override {
        return std::make_unique<gpu::HostKvStore>(layout, *g_);
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
    std::string describe() const override;
    DecodeGraphCounters graph_counters() const {
        return graphs_ ? graphs_->counters() : DecodeGraphCounters{};
    }
    void set_graphs(bool on) { graph_model_.graphs = on && o_.graphs; }

private:
    void check_call(const std::vector<int64_t>& tokens,
                    const SeqBatch& batch,
                    const std::vector<SequenceState*>& states) const;
    // out's rows reduced to top.n tokens each (TopLogits), their copies queued to the host.
    void download_top(Scratch& s, const Tensor& out, TopLogits& top);
    gpu::StepBatch make_step(Scratch& s,
                             const SeqBatch& batch,
                             const std::vector<SequenceState*>& states);
    // Layer i's uploaded routed experts against the ones the shard hosts (all E at ep = 1).
    void check_experts(const Model& host, size_t i) const;
    // The sequence's KDA block (its layer-0 S), made and zeroed by the first call.
    float* kda_state_of(DeviceSequence& ds);
    // h [n, d] f32 = the embedding rows of ids (i64 [n] on the device).
    void embed(Scratch& s, const Tensor& ids, Tensor& h);
    // The layers over the step's rows, h [n, d] updated in place: the eager forward and the
    // captured decode step share it. timed: the blocks' wall times, a synchronisation each.
    void layers(const gpu::StepBatch& step, Tensor& h, ForwardStats& stats, bool timed);
    // out [r, V] = the head of final_norm(rows [r, d]).
    void head(Scratch& s, const Tensor& rows, Tensor& out);
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
    CudaModelOptions o_;
    std::unique_ptr<Gpu> g_;
    Tensor embed_;       // [V, d] cd
    Tensor head_;        // [V, d] cd (embed_ when tied)
    Tensor final_norm_;  // [d]
    std::vector<gpu::LayerW> layers_;
    std::unique_ptr<gpu::DeviceVision> vision_;  // the vision tower (cfg.vision.present)
    std::vector<int> kda_index_;  // [n_layer] the layer's rank among the KDA layers, −1 otherwise
    int n_kda_ = 0;
    int first_attention_ = -1;  // the first MLA/DSA layer, −1 when none
    int64_t s_floats_ = 0;      // one KDA layer's S of one sequence: H·K·K
    int64_t tail_floats_ = 0;   // one KDA layer's conv tail of one sequence: (W−1)·3D
    bool kda_slots_ = false;    // the arena's S slots fit int32 (the fused kernels' slot ids)
    size_t weight_bytes_ = 0;
    int n_adapters_ = 0;  // LoRA adapters held (set_lora_adapters)
    DecodeGraphModel graph_model_;
    std::unique_ptr<gpu::DecodeGraphRunner> graphs_;  // null when no decode step can qualify
    std::unique_ptr<gpu::MoeEp> moe_ep_;  // the MoE layers over the ep group (ep > 1), else null
};

CudaModel::CudaModel(const Model& host, const CudaModelOptions& o) : cfg_(host.cfg), o_(o) {
    HYMOE_CHECK(
        host.shard.tp == 1 && host.shard.pp == 1 && (host.shard.ep == 1 || host.comms != nullptr),
        "make_cuda_model: the GPU model holds every layer whole but the routed experts "
        "(tp = pp = 1, experts split over ep with its comms), not a shard of tp ",
        host.shard.tp,
        ", pp ",
        host.shard.pp,
        ", ep ",
        host.shard.ep);
    HYMOE_CHECK(o.dtype == DType::f32 || o.dtype == DType::bf16,
                "make_cuda_model: matrices in ",
                to_string(o.dtype),
                " (f32 or bf16)");
    const size_t arena_bytes =
        static_cast<size_t>(static_cast<double>(cu::device_free_bytes()) * o.memory_fraction);
    const bool any_moe = count_layers(cfg_, Ffn::moe) + count_layers(cfg_, Ffn::latent_moe) > 0;
    g_ = std::make_unique<Gpu>(arena_bytes, any_moe ? std::max(cfg_.moe.n_routed_experts, 1) : 1);
    const size_t before = g_->arena.book().used();
    const int64_t V = cfg_.vocab_size, d = cfg_.hidden_size;
    embed_ = gpu::upload_weight(*g_, host.embed, {V, d}, o.dtype);
    head_ =
        cfg_.tie_word_embeddings ? embed_ : gpu::upload_weight(*g_, host.lm_head, {V, d}, o.dtype);
    final_norm_ = gpu::upload_weight(*g_, host.final_norm, {d}, DType::f32);
    kda_index_.assign(cfg_.layers.size(), -1);
    for (size_t i = 0; i < cfg_.layers.size(); ++i) {
        layers_.push_back(
            gpu::upload_layer(*g_, cfg_, host.layers[i], static_cast<int>(i), o.dtype));
        check_experts(host, i);
        if (cfg_.layers[i].mixer == Mixer::kda)
            kda_index_[i] = n_kda_++;
        else if (first_attention_ < 0)
            first_attention_ = static_cast<int>(i);
    }
    if (cfg_.vision.present)
        vision_ = std::make_unique<gpu::DeviceVision>(*g_, cfg_, host.vision, o.dtype);
    const int64_t D = int64_t{cfg_.kda.n_head} * cfg_.kda.head_dim;
    s_floats_ = D * cfg_.kda.head_dim;
    tail_floats_ = (cfg_.kda.conv_kernel - 1) * 3 * D;
    kda_slots_ = n_kda_ > 0 && g_->arena.book().capacity() /
                                       static_cast<size_t>(s_floats_ * int64_t{sizeof(float)}) <
                                   static_cast<size_t>(std::numeric_limits<int32_t>::max());
    weight_bytes_ = g_->arena.book().used() - before;
    if (host.shard.ep > 1)
        moe_ep_ = std::make_unique<gpu::MoeEp>(host.comms->ep, o.ep_overlap, o.fused);
    graph_model_.ep = host.shard.ep;
    make_graphs();
}

void CudaModel::check_experts(const Model& host, size_t i) const {
    const LayerSpec& spec = cfg_.layers[i];
    if (spec.ffn == Ffn::dense)
        return;
    const int64_t n_exp = cfg_.moe.n_routed_experts;
    const std::vector<int> local = local_expert_index(
        host.layers[i].moe.expert_rank, n_exp, host.shard.ep, host.shard.ep_rank);
    const auto hosted = std::count_if(local.begin(), local.end(), [](int l) { return l >= 0; });
    HYMOE_CHECK(layers_[i].moe.up.dim(0) == hosted,
                "make_cuda_model: layer ",
                i,
                " holds ",
                layers_[i].moe.up.dim(0),
                " routed experts where ep rank ",
                host.shard.ep_rank,
                " of ",
                host.shard.ep,
                " hosts ",
                hosted,
                ": is every hosted expert loaded?");
}

void CudaModel::make_graphs() {
    graph_model_.graphs = o_.graphs;
    graph_model_.fused = o_.fused;
    graph_model_.dtype = o_.dtype;
    graph_model_.kda_slots = kda_slots_;
    graph_model_.n_sm = cu::device_sm_count();
    graph_model_.max_key_bucket = key_bucket(1);
    while (graph_model_.max_key_bucket * 2 * std::max(cfg_.mla.n_head, 1) <= gpu::kScoreFloats)
        graph_model_.max_key_bucket *= 2;
    // memory for graphs only when the model's decode steps can qualify (the rules for a step of
    // one sequence at position 0 over resident pages: the model's own)
    const cu::DecodeBuckets buckets(std::max(o_.max_seqs, 1));
    if (decode_graph_refusal(cfg_, graph_model_, buckets, single_sequence(1), {}, true) !=
        GraphRefusal::none)
        return;
    // the workspace: a step of max_seqs rows with room to spare, the fused blocks' buffers and
    // one group's scores
    const int64_t rows = buckets.max();
    const auto workspace = static_cast<size_t>(2 * rows * row_floats() * 4 + fused_bytes(rows) +
                                               gpu::kScoreFloats * 4 + (int64_t{16} << 20));
    graphs_ = std::make_unique<gpu::DecodeGraphRunner>(
        *g_,
        buckets.max(),
        cfg_.vocab_size,
        workspace,
        KdaBlockShape{n_kda_, s_floats_, tail_floats_},
        kda_slots_ ? reinterpret_cast<float*>(g_->arena.base()) : nullptr,
        [this](const gpu::StepBatch& step, const Tensor& ids, Tensor& logits) {
            Scratch s(g_->arena);
            Tensor h = s(DType::f32, {step.n_tok, cfg_.hidden_size});  // [B, d]
            embed(s, ids, h);
            ForwardStats unused;  // no timings in a captured step
            unused.mixer_seconds.resize(cfg_.layers.size());
            unused.ffn_seconds.resize(cfg_.layers.size());
            unused.moe.resize(cfg_.layers.size());
            layers(step, h, unused, false);
            head(s, h, logits);
        });
}

void CudaModel::set_lora_adapters(const Model& host) {
    HYMOE_CHECK(n_adapters_ == 0 && host.layers.size() == layers_.size(),
                "set_lora_adapters: once, from the model this one was made from");
    const size_t before = g_->arena.book().used();
    for (size_t i = 0; i < layers_.size(); ++i)
        n_adapters_ =
            std::max(n_adapters_, gpu::upload_layer_lora(*g_, host.layers[i], layers_[i]));
    weight_bytes_ += g_->arena.book().used() - before;
    graph_model_.n_adapters = n_adapters_;
}

SequenceState CudaModel::new_sequence() {
    SequenceState s;
    s.attn.resize(cfg_.layers.size());
    s.device = std::make_shared<DeviceSequence>();
    s.device->arena = &g_->arena;
    return s;
}

int64_t CudaModel::row_floats() const {
    const int64_t d = cfg_.hidden_size;
    const KdaConfig& k = cfg_.kda;
    const MlaConfig& a = cfg_.mla;
    const MoeConfig& m = cfg_.moe;
    const int64_t D = int64_t{k.n_head} * k.head_dim, H = a.n_head;
    const int64_t d_qk = a.qk_nope_head_dim + a.qk_rope_head_dim;
    const int64_t d_lat = a.kv_lora_rank + a.qk_rope_head_dim;
    const int64_t w = std::max<int64_t>(m.latent_size, d);
    // floats a row holds at the widest point of each block (inputs, outputs, their casts)
    const int64_t kda = 10 * D + 4 * k.head_dim + 2 * k.n_head;
    const int64_t mla = H * (3 * d_qk + 2 * d_lat + 2 * a.kv_lora_rank + 3 * a.v_head_dim) +
                        2 * a.q_lora_rank + d_lat + 3 * cfg_.indexer.n_head * cfg_.indexer.head_dim;
    const int64_t moe = m.n_routed_experts + m.top_k * (2 * w + 2 * m.moe_intermediate) + 2 * w +
                        2 * m.shared_intermediate;
    const int64_t dense = 2 * cfg_.intermediate_size;
    // LoRA adapters (device_lora.h): an adapted projection's gathered rows of x and y and their
    // fp32 copies, next to its block's own
    const int64_t widest = std::max({w,
                                     3 * D,
                                     H * d_qk,
                                     d_lat,
                                     H * a.v_head_dim,
                                     int64_t{cfg_.intermediate_size},
                                     int64_t{m.moe_intermediate},
                                     int64_t{m.shared_intermediate}});
    const int64_t lora = n_adapters_ > 0 ? 4 * widest : 0;
    return 4 * d + std::max({kda, mla, moe, dense}) + lora;
}

int64_t CudaModel::fused_bytes(int64_t rows) const {
    // selections, plan scratch
    return o_.fused && o_.dtype == DType::bf16
               ? std::max(moe_fused_bytes(cfg_, rows),
                          dsa_fused_bytes(cfg_, rows, cu::device_sm_count()))
               : 0;
}

int64_t CudaModel::step_bytes() const {
    const int64_t T = o_.max_tokens, B = o_.max_seqs, V = cfg_.vocab_size;
    const int64_t per_row = row_floats() + (o_.logits_all ? V : 0);
    return 4 * (T * per_row + B * V) + (int64_t{256} << 20) + fused_bytes(T);  // + scores
}

int64_t CudaModel::kv_room() const {
    const cu::OffsetAllocator& book = g_->arena.book();
    const int64_t seqs = int64_t{o_.max_seqs} * sequence_floats() * 4;
    const int64_t left = static_cast<int64_t>(book.capacity() - book.used()) - step_bytes() - seqs;
    return std::max<int64_t>(left, 0);
}

int64_t CudaModel::kv_page_budget(int64_t page_bytes) const {
    return kv_room() / std::max<int64_t>(page_bytes, 1);
}

int64_t CudaModel::host_kv_page_budget(int64_t page_bytes, int64_t host_bytes) const {
    KvLayout one;  // one page: its slots on the device
    one.capacity = 1;
    int64_t row = 0;  // floats a token over the attention layers
    for (const LayerSpec& l : cfg_.layers) {
        one.width.push_back(kv_row_floats(cfg_, l.mixer));
        row += one.width.back();
    }
    const int64_t host = host_bytes / std::max<int64_t>(page_bytes, 1);
    if (row == 0)
        return host;
    one.page_tokens = static_cast<int>(page_bytes / (row * 4));
    return std::min(host, kv_room() / std::max<int64_t>(gpu::HostKvStore::slot_bytes(one), 1));
}

void CudaModel::encode_images(const std::vector<VisionImage>& images,
                              int pool,
                              Tensor& out,
                              VisionStats* stats) {
    HYMOE_CHECK(vision_ != nullptr, "GPU model: images for a model without a vision tower");
    // between steps: the room a step keeps free holds a pass
    const int64_t room = o_.vision_scratch_bytes > 0 ? o_.vision_scratch_bytes : step_bytes();
    vision_->encode(images, pool, room, out, stats);
}

std::string CudaModel::describe() const {
    const double gb = 1e-9;
    return cat("GPU model: ",
               to_string(o_.dtype),
               " matrices, weights ",
               static_cast<double>(weight_bytes_) * gb,
               " GB of a ",
               static_cast<double>(g_->arena.book().capacity()) * gb,
               " GB device arena",
               moe_ep_ ? cat(", routed experts over ep ",
                             moe_ep_->size(),
                             o_.ep_overlap ? " (two micro-batches overlapped)" : "")
                       : std::string());
}

void CudaModel::check_call(const std::vector<int64_t>& tokens,
                           const SeqBatch& batch,
                           const std::vector<SequenceState*>& states) const {
    HYMOE_CHECK(static_cast<int64_t>(tokens.size()) == batch.n_tok() &&
                    static_cast<int64_t>(states.size()) == batch.n_seq(),
                "GPU forward: ",
                tokens.size(),
                " tokens / ",
                states.size(),
                " states for a batch of ",
                batch.n_tok(),
                " tokens / ",
                batch.n_seq(),
                " sequences");
    for (int64_t s = 0; s < batch.n_seq(); ++s) {
        const SequenceState& st = *states[s];
        HYMOE_CHECK(st.n_tokens == batch.pos0[s] && batch.length(s) >= 1,
                    "GPU forward: sequence ",
                    s,
                    " state holds ",
                    st.n_tokens,
                    " tokens but the batch continues at ",
                    batch.pos0[s],
                    " with ",
                    batch.length(s),
                    " rows");
        HYMOE_CHECK(st.device && st.device->arena == &g_->arena,
                    "GPU forward: sequence ",
                    s,
                    " was not made by this model's new_sequence()");
    }
    for (int64_t t : tokens)
        HYMOE_CHECK(t >= 0 && t < cfg_.vocab_size,
                    "forward: token id ",
                    t,
                    " outside the vocabulary [0, ",
                    cfg_.vocab_size,
                    ")");
}

float* CudaModel::kda_state_of(DeviceSequence& ds) {
    if (ds.block != nullptr)
        return ds.state;
    const auto slot_bytes = static_cast<size_t>(s_floats_) * sizeof(float);
    char* const base = g_->arena.base();
    ds.block = g_->arena.allocate(static_cast<size_t>(sequence_floats()) * sizeof(float));
    const auto offset = static_cast<size_t>(static_cast<char*>(ds.block) - base);
    const size_t start = kda_slots_ ? (offset + slot_bytes - 1) / slot_bytes * slot_bytes : offset;
    ds.state = reinterpret_cast<float*>(base + start);
    cu::zero(ds.state,
             static_cast<size_t>(n_kda_ * (s_floats_ + tail_floats_)) * sizeof(float),
             g_->stream);
    return ds.state;
}

gpu::StepBatch CudaModel::make_step(Scratch& s,
                                    const SeqBatch& batch,
                                    const std::vector<SequenceState*>& states) {
    gpu::StepBatch step;
    step.batch = &batch;
    step.n_tok = batch.n_tok();
    step.n_seq = batch.n_seq();
    std::vector<int32_t> row_seq(static_cast<size_t>(step.n_tok));
    std::vector<int64_t> positions(static_cast<size_t>(step.n_tok));
    std::vector<int32_t> visible(static_cast<size_t>(step.n_tok));
    for (int64_t q = 0; q < step.n_seq; ++q)
        for (int64_t t = batch.offsets[q]; t < batch.offsets[q + 1]; ++t) {
            row_seq[t] = static_cast<int32_t>(q);
            positions[t] = batch.pos0[q] + (t - batch.offsets[q]);
            visible[t] = static_cast<int32_t>(positions[t] + 1);
        }
    step.offsets = gpu::upload_values(*g_, s, batch.offsets, DType::i64);
    step.row_seq = gpu::upload_values(*g_, s, row_seq, DType::i32);
    if (n_adapters_ > 0) {  // each adapter's rows, once for every adapted projection
        step.lora.n_adapters = n_adapters_;
        step.lora.rows = gpu::upload_lora_rows(*g_, s, adapter_rows(batch, n_adapters_), 1)[0];
        if (!step.lora.rows.empty())
            step.lora.row_adapter = lora_row_adapters(batch);
    }
    step.positions = gpu::upload_values(*g_, s, positions, DType::i64);
    step.visible = gpu::upload_values(*g_, s, visible, DType::i32);

    // KDA: each sequence's state block (a new one zeroed), S and tail pointers and S slots per
    // (layer, sequence)
    step.fused = o_.fused;
    step.n_kda = n_kda_;
    if (n_kda_ > 0) {
        const auto slot_bytes = static_cast<size_t>(s_floats_) * sizeof(float);
        char* const base = g_->arena.base();
        const auto cells = static_cast<size_t>(n_kda_ * step.n_seq);
        std::vector<float*> ptrs(2 * cells);  // [2, n_kda, n_seq] S, then tails
        std::vector<int32_t> slots(cells);    // [n_kda, n_seq]
        for (int64_t q = 0; q < step.n_seq; ++q) {
            DeviceSequence& ds = *states[q]->device;
            kda_state_of(ds);
            const auto slot0 = static_cast<int64_t>((reinterpret_cast<char*>(ds.state) - base) /
                                                    static_cast<int64_t>(slot_bytes));
            for (int64_t j = 0; j < n_kda_; ++j) {
                const auto c = static_cast<size_t>(j * step.n_seq + q);
                ptrs[c] = ds.state + j * s_floats_;
                ptrs[cells + c] = ds.state + n_kda_ * s_floats_ + j * tail_floats_;
                slots[c] = static_cast<int32_t>(slot0 + j);
            }
        }
        static_assert(sizeof(float*) == sizeof(int64_t));  // the pointers travel as i64
        step.kda_states = gpu::upload_values(*g_, s, ptrs, DType::i64);
        if (kda_slots_) {
            step.kda_pool = reinterpret_cast<float*>(base);
            step.kda_slots = gpu::upload_values(*g_, s, slots, DType::i32);
        }
    }
    if (first_attention_ < 0)
        return step;

    // the paged cache: one pool for every sequence, its store ours, block tables covering the step
    KvPool* pool = states.empty() ? nullptr : states[0]->attn[first_attention_].pool;
    HYMOE_CHECK(pool != nullptr || states.empty(),
                "GPU forward: the sequences are not paged into a KvPool (attach_kv_pool)");
    if (pool == nullptr)
        return step;
    auto* store = dynamic_cast<CudaKvStore*>(&pool->store());
    auto* host_kv = dynamic_cast<gpu::HostKvStore*>(&pool->store());
    HYMOE_CHECK(store ? &store->arena() == &g_->arena : host_kv != nullptr && host_kv->on(*g_),
                "GPU forward: the KvPool's pages are not this GPU model's (DeviceModel::kv_store "
                "or host_kv_store)");
    if (store != nullptr) {  // the host tier sets these in stage_step
        step.pages = store->pages();
        step.page_stride = store->page_floats();
        step.layer_offset = store->offsets();
    }
    step.page_tokens = pool->page_tokens();
    step.row_width.resize(cfg_.layers.size());
    for (size_t i = 0; i < cfg_.layers.size(); ++i)
        step.row_width[i] = pool->row_width(static_cast<int>(i));
    for (const SequenceState* st : states) {
        HYMOE_CHECK(st->attn[first_attention_].pool == pool,
                    "GPU forward: the sequences of one step page into different pools");
        step.max_pages = std::max(step.max_pages, static_cast<int>(st->pages.size()));
    }
    step.max_pages = std::max(step.max_pages, 1);
    const auto mp = static_cast<size_t>(step.max_pages);
    std::vector<int32_t> table(static_cast<size_t>(step.n_seq) * mp, -1), one_table;
    std::vector<int32_t> one_keys;
    std::vector<int64_t> one_rows;
    for (int64_t q = 0; q < step.n_seq; ++q) {
        const std::vector<int32_t>& pages = states[q]->pages;
        const int64_t keys = batch.pos0[q] + batch.length(q);
        HYMOE_CHECK(static_cast<int64_t>(pages.size()) * step.page_tokens >= keys,
                    "GPU forward: sequence ",
                    q,
                    "'s block table covers ",
                    pages.size() * step.page_tokens,
                    " tokens, not ",
                    keys);
        std::copy(pages.begin(), pages.end(), table.begin() + q * step.max_pages);
    }
    if (host_kv != nullptr)  // the tables in slot indices
        host_kv->stage_step(batch, table, step);
    for (int64_t q = 0; q < step.n_seq; ++q) {
        const int64_t keys = batch.pos0[q] + batch.length(q);
        if (batch.length(q) != 1)
            continue;
        one_rows.push_back(batch.offsets[q]);
        one_keys.push_back(static_cast<int32_t>(keys));
        one_table.insert(one_table.end(),
                         table.begin() + q * step.max_pages,
                         table.begin() + (q + 1) * step.max_pages);
        step.one_max_keys = std::max(step.one_max_keys, keys);
    }
    step.block_table = gpu::upload_values(*g_, s, table, DType::i32);
    step.n_one = static_cast<int64_t>(one_rows.size());
    step.one_rows = gpu::upload_values(*g_, s, one_rows, DType::i64);
    step.one_table = gpu::upload_values(*g_, s, one_table, DType::i32);
    step.one_keys = gpu::upload_values(*g_, s, one_keys, DType::i32);
    return step;
}

void CudaModel::embed(Scratch& s, const Tensor& ids, Tensor& h) {
    const DType cd = o_.dtype;
    Tensor e = cd == DType::f32 ? h : s(cd, h.shape);  // [n, d] the table's rows
    cu::embed_rows(g_->stream, embed_, ids, 0, e);
    if (cd != DType::f32)
        cu::cast(g_->stream, e, h);
}

void CudaModel::layers(const gpu::StepBatch& step, Tensor& h, ForwardStats& stats, bool timed) {
    const int64_t n = step.n_tok, d = cfg_.hidden_size;
    // wall seconds with the GPU caught up when timings were asked for (a synchronisation each)
    auto now = [&] {
        if (timed)
            g_->stream.synchronize();
        return wall_seconds();
    };
    const cu::Stream& st = g_->stream;
    const float eps = static_cast<float>(cfg_.rms_norm_eps);
    const DType cd = o_.dtype;
    Scratch s(g_->arena);
    Tensor xn = s(DType::f32, {n, d}), y = s(DType::f32, {n, d});  // [n, d] normed input, block out
    for (size_t i = 0; i < cfg_.layers.size(); ++i) {
        const LayerSpec& spec = cfg_.layers[i];
        const gpu::LayerW& w = layers_[i];
        const double t0 = now();
        cu::rms_norm(st, h, w.attn_norm, eps, xn);
        if (spec.mixer == Mixer::kda) {
            gpu::kda_block(*g_, cfg_, w.kda, xn, step, kda_index_[i], cd, y);
        } else {
            if (step.host_kv != nullptr)
                step.host_kv->await_layer(static_cast<int>(i));
            double indexer = 0;
            gpu::attention_block(*g_,
                                 cfg_,
                                 spec,
                                 w.mla,
                                 xn,
                                 step,
                                 static_cast<int>(i),
                                 cd,
                                 y,
                                 timed ? &indexer : nullptr);
            if (step.host_kv != nullptr)
                step.host_kv->release_layer(static_cast<int>(i));
            stats.attn.indexer_seconds += indexer;
            stats.attn.attention_seconds += now() - t0 - indexer;
        }
        cu::add_inplace(st, h, y);
        const double t1 = now();
        stats.mixer_seconds[i] += t1 - t0;
        cu::rms_norm(st, h, w.ffn_norm, eps, xn);
        if (spec.ffn == Ffn::dense) {
            Scratch sd(g_->arena);
            gpu::mlp_block(*g_,
                           w.dense,
                           ExpertAct::swiglu,
                           gpu::in_dtype(*g_, sd, xn, cd),
                           y,
                           0.0f,
                           &step.lora.rows);
        } else {
            if (moe_ep_)
                moe_ep_->forward(*g_, cfg_, spec, w.moe, xn, cd, y, stats.moe[i]);
            else
                gpu::moe_block(
                    *g_, cfg_, spec, w.moe, xn, cd, o_.fused, timed, y, stats.moe[i], &step.lora);
        }
        cu::add_inplace(st, h, y);
        stats.ffn_seconds[i] += now() - t1;
    }
    if (step.host_kv != nullptr)
        step.host_kv->finish_step();
}

void CudaModel::head(Scratch& s, const Tensor& rows, Tensor& out) {
    Tensor normed = s(DType::f32, rows.shape);
    cu::rms_norm(g_->stream, rows, final_norm_, static_cast<float>(cfg_.rms_norm_eps), normed);
    g_->blas.linear(gpu::in_dtype(*g_, s, normed, o_.dtype), head_, out);
}

// Each sequence advances by its rows.
void advance(const ModelConfig& cfg,
             const SeqBatch& batch,
             const std::vector<SequenceState*>& states) {
    for (int64_t q = 0; q < batch.n_seq(); ++q) {
        states[q]->n_tokens += batch.length(q);
        for (size_t i = 0; i < cfg.layers.size(); ++i)
            if (cfg.layers[i].mixer != Mixer::kda)
                states[q]->attn[i].n += batch.length(q);
    }
}

void CudaModel::download_top(Scratch& s, const Tensor& out, TopLogits& top) {
    const int64_t r = out.dim(0), n = top.n;
    const cu::Stream& st = g_->stream;
    Tensor idx = s(DType::i64, {r, n}), values = s(DType::f32, {r, n});  // [r, n]
    Tensor sums = s(DType::i64, {r});  // [r] doubles (an 8-byte element type)
    cu::top_k_rows(st, out, n, idx);
    cu::top_logit_rows(st, out, idx, values, static_cast<double*>(sums.data));
    top.tokens.resize(static_cast<size_t>(r * n));
    top.logits.resize(static_cast<size_t>(r * n));
    top.log_sum.resize(static_cast<size_t>(r));
    cu::copy_to_host(top.tokens.data(), idx.data, idx.bytes(), st);
    cu::copy_to_host(top.logits.data(), values.data, values.bytes(), st);
    cu::copy_to_host(top.log_sum.data(), sums.data, sums.bytes(), st);
}

bool CudaModel::forward_graph(const std::vector<int64_t>& tokens,
                              const SeqBatch& batch,
                              const std::vector<SequenceState*>& states,
                              Buffer& logits,
                              const ForwardOptions& options,
                              TopLogits* top) {
    // the store of the sequences' pages: plainly resident (this model's CudaKvStore, not the host
    // tier) and one for all
    KvPool* pool = nullptr;
    const CudaKvStore* store = nullptr;
    bool resident = true;
    if (first_attention_ >= 0 && !states.empty()) {
        pool = states[0]->attn[first_attention_].pool;
        store = pool ? dynamic_cast<const CudaKvStore*>(&pool->store()) : nullptr;
        resident = store != nullptr && &store->arena() == &g_->arena;
        for (const SequenceState* st : states)
            resident = resident && st->attn[first_attention_].pool == pool;
    }
    if (decode_graph_refusal(cfg_, graph_model_, graphs_->buckets(), batch, options, resident) !=
        GraphRefusal::none)
        return false;
    char* const base = g_->arena.base();
    const auto slot_bytes = static_cast<int64_t>(s_floats_ * sizeof(float));
    std::vector<DecodeRow> rows(static_cast<size_t>(batch.n_seq()));
    for (size_t q = 0; q < rows.size(); ++q) {
        DecodeRow& r = rows[q];
        r.token = tokens[q];
        r.position = batch.pos0[q];
        r.pages = store ? &states[q]->pages : nullptr;
        if (n_kda_ > 0) {
            float* S = kda_state_of(*states[q]->device);
            r.kda_state = reinterpret_cast<uint64_t>(S);
            r.kda_slot = static_cast<int32_t>((reinterpret_cast<char*>(S) - base) / slot_bytes);
        }
    }
    gpu::KvGeometry kv;
    if (store) {
        kv.pages = store->pages();
        kv.page_floats = store->page_floats();
        kv.page_tokens = pool->page_tokens();
        kv.layer_offset = store->offsets();
        for (size_t i = 0; i < cfg_.layers.size(); ++i)
            kv.row_width.push_back(pool->row_width(static_cast<int>(i)));
    }
    const Tensor out = graphs_->run(rows, store ? &kv : nullptr);  // [n, V] on the device
    if (top != nullptr) {
        Scratch s(g_->arena);
        download_top(s, out, *top);
        logits = Buffer();
    } else {
        logits = Buffer(DType::f32, out.shape);
        cu::download(out, logits.view(), g_->stream);
    }
    g_->stream.synchronize();
    advance(cfg_, batch, states);
    return true;
}

void CudaModel::forward(const std::vector<int64_t>& tokens,
                        const SeqBatch& batch,
                        const std::vector<SequenceState*>& states,
                        Buffer& logits,
                        const ForwardOptions& options,
                        TopLogits* top) {
    check_call(tokens, batch, states);
    HYMOE_CHECK(top == nullptr ||
                    (options.logits == Logits::last && top->n >= 1 && top->n <= cfg_.vocab_size),
                "GPU forward: the rows reduced to their top ",
                top ? top->n : 0,
                " tokens need last-row logits and 1 ≤ n ≤ ",
                cfg_.vocab_size);
    if (graphs_ && forward_graph(tokens, batch, states, logits, options, top))
        return;
    const int64_t n = batch.n_tok(), n_seq = batch.n_seq(), d = cfg_.hidden_size;
    const int64_t V = cfg_.vocab_size, n_layer = static_cast<int64_t>(cfg_.layers.size());
    ForwardStats scratch_stats;  // where timings go when the caller asked for none
    ForwardStats& stats = options.stats ? *options.stats : scratch_stats;
    stats.mixer_seconds.resize(n_layer);
    stats.ffn_seconds.resize(n_layer);
    stats.moe.resize(n_layer);
    stats.layer_flops.resize(n_layer);
    if (n == 0) {
        for (size_t i = 0; moe_ep_ && i < cfg_.layers.size(); ++i)  // the ep group's collectives
            if (cfg_.layers[i].ffn != Ffn::dense) {
                Scratch s(g_->arena);
                Tensor none = s(DType::f32, {0, d}), out = s(DType::f32, {0, d});  // [0, d]
                moe_ep_->forward(
                    *g_, cfg_, cfg_.layers[i], layers_[i].moe, none, o_.dtype, out, stats.moe[i]);
            }
        logits = Buffer(DType::f32, {0, V});
        if (top != nullptr)
            top->tokens.clear(), top->logits.clear(), top->log_sum.clear();
        return;
    }
    ++stats.steps;
    const bool timed = options.stats != nullptr;
    auto now = [&] {
        if (timed)
            g_->stream.synchronize();
        return wall_seconds();
    };
    const cu::Stream& st = g_->stream;
    Scratch s(g_->arena);
    double t0 = now();
    const gpu::StepBatch step = make_step(s, batch, states);
    Tensor h = s(DType::f32, {n, d});  // [n, d] the residual stream
    embed(s, gpu::upload_values(*g_, s, tokens, DType::i64), h);
    if (options.media != nullptr && !options.media->rows.empty()) {
        const MediaSplice& media = *options.media;
        const auto n_media = static_cast<int64_t>(media.rows.size());
        HYMOE_CHECK(media.embeds.view().numel() == n_media * d,
                    "forward: ",
                    n_media,
                    " media rows for embeds of ",
                    media.embeds.view().numel(),
                    " floats");
        for (int64_t r : media.rows)
            HYMOE_CHECK(r >= 0 && r < n, "forward: media row ", r, " outside the batch");
        Tensor embeds = s(DType::f32, {n_media, d});
        cu::upload(media.embeds.view(), embeds, st);
        cu::scatter_rows(st, embeds, gpu::upload_values(*g_, s, media.rows, DType::i64), h);
    }
    stats.head_seconds += now() - t0;

    layers(step, h, stats, timed);
    advance(cfg_, batch, states);

    // final norm and head, on every row or only the last row of each sequence
    t0 = now();
    Tensor rows = h;
    if (options.logits == Logits::last) {
        std::vector<int64_t> last(static_cast<size_t>(n_seq));
        for (int64_t q = 0; q < n_seq; ++q)
            last[q] = batch.offsets[q + 1] - 1;
        rows = s(DType::f32, {n_seq, d});
        cu::gather_rows(st, h, gpu::upload_values(*g_, s, last, DType::i64), rows);
    }
    const int64_t r = rows.dim(0);
    Tensor out = s(DType::f32, {r, V});
    head(s, rows, out);
    if (top != nullptr) {
        download_top(s, out, *top);
        logits = Buffer();
    } else {
        logits = Buffer(DType::f32, {r, V});
        cu::download(out, logits.view(), st);
    }
    st.synchronize();
    stats.head_seconds += wall_seconds() - t0;
}

}  // namespace

std::unique_ptr<DeviceModel> make_cuda_model(const Model& host, const CudaModelOptions& options) {
    return std::make_unique<CudaModel>(host, options);
}

DecodeGraphCounters decode_graph_counters(const DeviceModel& model) {
    const auto* m = dynamic_cast<const CudaModel*>(&model);
    HYMOE_CHECK(m != nullptr, "decode_graph_counters: not a model of make_cuda_model");
    return m->graph_counters();
}

void set_decode_graphs(DeviceModel& model, bool on) {
    auto* m = dynamic_cast<CudaModel*>(&model);
    HYMOE_CHECK(m != nullptr, "set_decode_graphs: not a model of make_cuda_model");
    m->set_graphs(on);
}

}  // namespace hymoe::model
