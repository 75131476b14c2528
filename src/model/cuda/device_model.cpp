// The GPU model (model/cuda_model.h): the weights uploaded once, the KV pages of a pool in one
// device block (KvPool's layout: page p holds every attention layer's rows of its tokens, layer
// after layer), every sequence's KDA states in one device block made at its first forward and
// freed with it, and the forward: the step's packed batch on the device (offsets, positions,
// block tables, state pointers; one small upload each), the embedding, the layers
// (h += mixer(RMSNorm₁ h); h += ffn(RMSNorm₂ h), blocks in device_*.cpp), the final norm and the
// head, and one copy of the logits to the host (or of each row's top tokens: model::TopLogits).
#include <algorithm>
#include <limits>
#include <memory>

#include "device_blocks.h"
#include "device_vision.h"
#include "hymoe/backend/cuda_ops.h"
#include "hymoe/core/error.h"
#include "hymoe/core/timer.h"
#include "hymoe/model/cuda_model.h"
#include "hymoe/model/fused_step.h"

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
    std::string describe() const override;

private:
    void check_call(const std::vector<int64_t>& tokens,
                    const SeqBatch& batch,
                    const std::vector<SequenceState*>& states) const;
    // out's rows reduced to top.n tokens each (TopLogits), their copies queued to the host.
    void download_top(Scratch& s, const Tensor& out, TopLogits& top);
    gpu::StepBatch make_step(Scratch& s,
                             const SeqBatch& batch,
                             const std::vector<SequenceState*>& states);
    // Bytes one step of max_tokens rows may hold at once (activations, scores, the fused
    // blocks' buffers, logits).
    int64_t step_bytes() const;
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
};

CudaModel::CudaModel(const Model& host, const CudaModelOptions& o) : cfg_(host.cfg), o_(o) {
    HYMOE_CHECK(host.shard.tp == 1 && host.shard.pp == 1 && host.shard.ep == 1,
                "make_cuda_model: the GPU model holds the whole model (tp = pp = ep = 1), not a "
                "shard of tp ",
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
}

SequenceState CudaModel::new_sequence() {
    SequenceState s;
    s.attn.resize(cfg_.layers.size());
    s.device = std::make_shared<DeviceSequence>();
    s.device->arena = &g_->arena;
    return s;
}

int64_t CudaModel::step_bytes() const {
    const int64_t T = o_.max_tokens, B = o_.max_seqs, d = cfg_.hidden_size, V = cfg_.vocab_size;
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
    const int64_t per_row = 4 * d + std::max({kda, mla, moe, dense}) + (o_.logits_all ? V : 0);
    // the fused blocks' own buffers (selections, plan scratch; one block's at a time)
    const int64_t fused =
        o_.fused && o_.dtype == DType::bf16
            ? std::max(moe_fused_bytes(cfg_, T), dsa_fused_bytes(cfg_, T, cu::device_sm_count()))
            : 0;
    return 4 * (T * per_row + B * V) + (int64_t{256} << 20) + fused;  // + scores (bounded)
}

int64_t CudaModel::kv_page_budget(int64_t page_bytes) const {
    const cu::OffsetAllocator& book = g_->arena.book();
    const int64_t seqs = int64_t{o_.max_seqs} * sequence_floats() * 4;
    const int64_t left = static_cast<int64_t>(book.capacity() - book.used()) - step_bytes() - seqs;
    return std::max<int64_t>(left, 0) / std::max<int64_t>(page_bytes, 1);
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
               " GB device arena");
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
    step.positions = gpu::upload_values(*g_, s, positions, DType::i64);
    step.visible = gpu::upload_values(*g_, s, visible, DType::i32);

    // KDA: each sequence's state block (a new one zeroed), S and tail pointers and S slots per
    // (layer, sequence)
    step.fused = o_.fused;
    step.n_kda = n_kda_;
    if (n_kda_ > 0) {
        const auto slot_bytes = static_cast<size_t>(s_floats_) * sizeof(float);
        const size_t used =
            static_cast<size_t>(n_kda_ * (s_floats_ + tail_floats_)) * sizeof(float);
        char* const base = g_->arena.base();
        const auto cells = static_cast<size_t>(n_kda_ * step.n_seq);
        std::vector<float*> ptrs(2 * cells);  // [2, n_kda, n_seq] S, then tails
        std::vector<int32_t> slots(cells);    // [n_kda, n_seq]
        for (int64_t q = 0; q < step.n_seq; ++q) {
            DeviceSequence& ds = *states[q]->device;
            if (ds.block == nullptr) {
                ds.block =
                    g_->arena.allocate(static_cast<size_t>(sequence_floats()) * sizeof(float));
                const auto offset = static_cast<size_t>(static_cast<char*>(ds.block) - base);
                const size_t start =
                    kda_slots_ ? (offset + slot_bytes - 1) / slot_bytes * slot_bytes : offset;
                ds.state = reinterpret_cast<float*>(base + start);
                cu::zero(ds.state, used, g_->stream);
            }
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
    HYMOE_CHECK(store != nullptr && &store->arena() == &g_->arena,
                "GPU forward: the KvPool's pages are not this GPU model's (DeviceModel::kv_store)");
    step.pages = store->pages();
    step.page_stride = store->page_floats();
    step.page_tokens = pool->page_tokens();
    step.layer_offset = store->offsets();
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
    const int64_t n = batch.n_tok(), n_seq = batch.n_seq(), d = cfg_.hidden_size;
    const int64_t V = cfg_.vocab_size, n_layer = static_cast<int64_t>(cfg_.layers.size());
    ForwardStats scratch_stats;  // where timings go when the caller asked for none
    ForwardStats& stats = options.stats ? *options.stats : scratch_stats;
    stats.mixer_seconds.resize(n_layer);
    stats.ffn_seconds.resize(n_layer);
    stats.moe.resize(n_layer);
    stats.layer_flops.resize(n_layer);
    if (n == 0) {
        logits = Buffer(DType::f32, {0, V});
        if (top != nullptr)
            top->tokens.clear(), top->logits.clear(), top->log_sum.clear();
        return;
    }
    ++stats.steps;
    // wall seconds with the GPU caught up when timings were asked for (a synchronisation each)
    const bool timed = options.stats != nullptr;
    auto now = [&] {
        if (timed)
            g_->stream.synchronize();
        return wall_seconds();
    };
    const cu::Stream& st = g_->stream;
    const float eps = static_cast<float>(cfg_.rms_norm_eps);
    const DType cd = o_.dtype;
    Scratch s(g_->arena);
    double t0 = now();
    const gpu::StepBatch step = make_step(s, batch, states);
    Tensor h = s(DType::f32, {n, d});  // [n, d] the residual stream
    {
        const Tensor ids = gpu::upload_values(*g_, s, tokens, DType::i64);
        Tensor e = cd == DType::f32 ? h : s(cd, {n, d});  // [n, d] the table's rows
        cu::embed_rows(st, embed_, ids, 0, e);
        if (cd != DType::f32)
            cu::cast(st, e, h);
    }
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

    Tensor xn = s(DType::f32, {n, d}), y = s(DType::f32, {n, d});  // [n, d] normed input, block out
    for (int64_t i = 0; i < n_layer; ++i) {
        const LayerSpec& spec = cfg_.layers[i];
        const gpu::LayerW& w = layers_[i];
        t0 = now();
        cu::rms_norm(st, h, w.attn_norm, eps, xn);
        if (spec.mixer == Mixer::kda) {
            gpu::kda_block(*g_, cfg_, w.kda, xn, step, kda_index_[i], cd, y);
        } else {
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
            stats.attn.indexer_seconds += indexer;
            stats.attn.attention_seconds += now() - t0 - indexer;
        }
        cu::add_inplace(st, h, y);
        const double t1 = now();
        stats.mixer_seconds[i] += t1 - t0;
        cu::rms_norm(st, h, w.ffn_norm, eps, xn);
        if (spec.ffn == Ffn::dense) {
            Scratch sd(g_->arena);
            gpu::mlp_block(
                *g_, w.dense, ExpertAct::swiglu, gpu::in_dtype(*g_, sd, xn, cd), y, 0.0f);
        } else {
            gpu::moe_block(*g_, cfg_, spec, w.moe, xn, cd, o_.fused, timed, y, stats.moe[i]);
        }
        cu::add_inplace(st, h, y);
        stats.ffn_seconds[i] += now() - t1;
    }
    for (int64_t q = 0; q < n_seq; ++q) {
        states[q]->n_tokens += batch.length(q);
        for (int64_t i = 0; i < n_layer; ++i)
            if (cfg_.layers[i].mixer != Mixer::kda)
                states[q]->attn[i].n += batch.length(q);
    }

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
    Tensor normed = s(DType::f32, {r, d}), out = s(DType::f32, {r, V});
    cu::rms_norm(st, rows, final_norm_, eps, normed);
    g_->blas.linear(gpu::in_dtype(*g_, s, normed, cd), head_, out);
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

}  // namespace hymoe::model
