// The model on a device (model/device_model.h), its setup: the weights uploaded once (the routed
// experts this rank hosts at ep > 1), the decode graphs' runner, LoRA adapters, the memory budgets
// (KV pages next to the weights, max_seqs KDA states and one step; or the host tier's pages), the
// prefix cache's copies of a sequence's KDA block, the vision encoder, and the factory. The class
// is device_model_impl.h; a step's batch on the device is device_step.cpp, the forward
// device_forward.cpp.
#include <algorithm>
#include <limits>
#include <memory>

#include "device_model_impl.h"
#include "hymoe/backend/device.h"
#include "hymoe/backend/ops_rows.h"
#include "hymoe/model/fused_step.h"
#include "hymoe/model/kv_staging.h"
#include "hymoe/model/shard.h"
#include "hymoe/parallel/comm.h"
#include "hymoe/parallel/comms.h"

namespace hymoe::model {

namespace dev {

DeviceModelOn::DeviceModelOn(const Model& host, const DeviceModelOptions& o)
    : cfg_(host.local), o_(o), shard_(host.shard), comms_(host.comms) {
    HYMOE_CHECK(
        host.comms != nullptr || (host.shard.tp == 1 && host.shard.pp == 1 && host.shard.ep == 1),
        "make_device_model: a rank's part of the model (tp ",
        host.shard.tp,
        ", pp ",
        host.shard.pp,
        ", ep ",
        host.shard.ep,
        ") without the grid's comms");
    const bool any_moe = count_layers(cfg_, Ffn::moe) + count_layers(cfg_, Ffn::latent_moe) > 0;
    HYMOE_CHECK(o.dtype == DType::f32 || o.dtype == DType::bf16,
                "make_device_model: matrices in ",
                to_string(o.dtype),
                " (f32 or bf16)");
    // a decode graph captures a whole step on a GPU, embedding to head (one stage holds a part of
    // it), and no tp collectives
    o_.graphs = o.graphs && o.device == Device::cuda && shard_.pp == 1 && shard_.tp == 1;
    shell_.cfg = host.cfg;
    shell_.shard = host.shard;
    shell_.local = host.local;
    shell_.comms = host.comms;
    const size_t arena_bytes =
        o.arena_bytes > 0 ? o.arena_bytes
                          : static_cast<size_t>(static_cast<double>(backend::free_device_bytes()) *
                                                o.memory_fraction);
    owned_ = std::make_unique<backend::OwnedCtx>(
        o.device, arena_bytes, any_moe ? std::max(cfg_.moe.n_routed_experts, 1) : 1);
    n_sm_ = o.device == Device::cuda ? backend::device_multiprocessors() : 0;
    views_ = model_views(host, upload_weights(ctx(), keep_, host, o.dtype));  // the rank's part
    moe_.resize(cfg_.layers.size());
    kda_index_.assign(cfg_.layers.size(), -1);
    for (int i = shard_.first_layer; i < shard_.end_layer; ++i) {
        if (cfg_.layers[i].ffn != Ffn::dense) {
            moe_[i] = moe_weights(views_.layers[i].moe, host.layers[i].moe);
            views_.layers[i].moe = moe_views_of(
                moe_[i], o.dtype, cfg_.moe.n_routed_experts, shard_.ep > 1 ? &comms_->ep : nullptr);
        }
        check_experts(host, i);
        if (cfg_.layers[i].mixer == Mixer::kda)
            kda_index_[i] = n_kda_++;
        else if (first_attention_ < 0)
            first_attention_ = i;
    }
    if (cfg_.vision.present && shard_.first_stage())
        vision_ = std::make_unique<DeviceVision>(ctx(), keep_, cfg_, host.vision, o.dtype);
    const int64_t D = int64_t{cfg_.kda.n_head} * cfg_.kda.head_dim;
    s_floats_ = D * cfg_.kda.head_dim;
    tail_floats_ = (cfg_.kda.conv_kernel - 1) * 3 * D;
    kda_slots_ = n_kda_ > 0 && owned_->base() != nullptr &&
                 owned_->capacity() / static_cast<size_t>(s_floats_ * int64_t{sizeof(float)}) <
                     static_cast<size_t>(std::numeric_limits<int32_t>::max());
    weight_bytes_ = kept_bytes(keep_);
    graph_model_.ep = host.shard.ep;
    make_graphs();
}

void DeviceModelOn::check_experts(const Model& host, int i) const {
    const LayerSpec& spec = cfg_.layers[i];
    if (spec.ffn == Ffn::dense)
        return;
    const int64_t n_exp = cfg_.moe.n_routed_experts;
    const std::vector<int> local = local_expert_index(
        host.layers[i].moe.expert_rank, n_exp, host.shard.ep, host.shard.ep_rank);
    const auto hosted = std::count_if(local.begin(), local.end(), [](int l) { return l >= 0; });
    HYMOE_CHECK(moe_[i].up.dim(0) == hosted,
                "make_device_model: layer ",
                i,
                " holds ",
                moe_[i].up.dim(0),
                " routed experts where ep rank ",
                host.shard.ep_rank,
                " of ",
                host.shard.ep,
                " hosts ",
                hosted,
                ": is every hosted expert loaded?");
}

void DeviceModelOn::make_graphs() {
    graph_model_.graphs = o_.graphs;
    graph_model_.fused = o_.fused;
    graph_model_.dtype = o_.dtype;
    graph_model_.kda_slots = kda_slots_;
    graph_model_.n_sm = n_sm_;
    graph_model_.max_key_bucket = key_bucket(1);
    while (graph_model_.max_key_bucket * 2 * std::max(cfg_.mla.n_head, 1) <= kScoreFloats)
        graph_model_.max_key_bucket *= 2;
    // memory for graphs only when the model's decode steps can qualify (the rules for a step of
    // one sequence at position 0 over resident pages: the model's own)
    const backend::cuda::DecodeBuckets buckets(std::max(o_.max_seqs, 1));
    if (decode_graph_refusal(cfg_, graph_model_, buckets, single_sequence(1), {}, true) !=
        GraphRefusal::none)
        return;
#ifdef HYMOE_CUDA  // (graphs qualify on a GPU alone)
    // the workspace: a step of max_seqs rows with room to spare, the fused blocks' buffers and
    // one group's scores
    const int64_t rows = buckets.max();
    const auto workspace = static_cast<size_t>(2 * rows * row_floats() * 4 + fused_bytes(rows) +
                                               kScoreFloats * 4 + (int64_t{16} << 20));
    graphs_ = make_decode_graphs(
        ctx(),
        buckets.max(),
        cfg_.vocab_size,
        workspace,
        KdaBlockShape{n_kda_, s_floats_, tail_floats_},
        kda_slots_ ? reinterpret_cast<float*>(owned_->base()) : nullptr,
        [this](const StepBatch& step, const Tensor& ids, Tensor& logits) {
            const ModelOn model = on();
            backend::Scratch s(ctx());
            Tensor h = s(DType::f32, {step.n_tok, cfg_.hidden_size});  // [B, d]
            detail::embed_ids(model, ids, h);
            TableStep states(cfg_, shard_, kda_index_, step, o_.dtype, n_sm_, nullptr);
            ForwardStats unused;  // no timings in a captured step
            detail::run_step_layers(model, *step.batch, states, {}, h, unused, false);
            detail::head_logits(model, h, logits);
        });
#endif
}

void DeviceModelOn::set_lora_adapters(const Model& host) {
    HYMOE_CHECK(n_adapters_ == 0 && host.layers.size() == views_.layers.size(),
                "set_lora_adapters: once, from the model this one was made from");
    for (int i = shard_.first_layer; i < shard_.end_layer; ++i) {
        n_adapters_ =
            std::max(n_adapters_,
                     upload_layer_lora(ctx(), keep_, host.layers[i], views_.layers[i], moe_[i]));
        if (cfg_.layers[i].ffn != Ffn::dense)  // the experts' adapters: their views anew
            views_.layers[i].moe = moe_views_of(moe_[i],
                                                o_.dtype,
                                                cfg_.moe.n_routed_experts,
                                                shard_.ep > 1 ? &comms_->ep : nullptr);
    }
    weight_bytes_ = kept_bytes(keep_);
    graph_model_.n_adapters = n_adapters_;
}

void DeviceModelOn::place_experts(const Model& host, int layer) {
    HYMOE_CHECK(shard_.owns_layer(layer) && cfg_.layers[layer].ffn != Ffn::dense,
                "place_experts: layer ",
                layer,
                " is not an MoE layer of this stage");
    MoeW& w = moe_[layer];
    HYMOE_CHECK(w.experts.lora_views.empty(),
                "place_experts: layer ",
                layer,
                "'s routed experts carry LoRA adapters, which would stay in their old slots");
    replace_experts(
        ctx(), host.layers[layer].moe, hosted_experts(cfg_, shard_, w.host.expert_rank), w);
    views_.layers[layer].moe =
        moe_views_of(w, o_.dtype, cfg_.moe.n_routed_experts, shard_.ep > 1 ? &comms_->ep : nullptr);
    check_experts(host, layer);
}

SequenceState DeviceModelOn::new_sequence() {
    SequenceState s;
    s.attn.resize(cfg_.layers.size());
    s.device = std::make_shared<DeviceSequence>();
    s.device->owner = this;
    return s;
}

Buffer DeviceModelOn::save_kda_states(const SequenceState& s) {
    HYMOE_CHECK(s.device != nullptr && s.device->owner == this,
                "save_kda_states: a sequence not made by this model's new_sequence()");
    if (n_kda_ == 0)
        return Buffer();
    const DeviceSequence& ds = *s.device;
    HYMOE_CHECK(ds.state != nullptr, "save_kda_states: a sequence no forward has seen");
    const int64_t n = n_kda_ * (s_floats_ + tail_floats_);  // the block: S, then the tails
    Buffer out(DType::f32, {n}, uninit);
    ops::download(ctx(), Tensor{ds.state, DType::f32, o_.device, {n}}, out.view());
    return out;
}

void DeviceModelOn::load_kda_states(const Buffer& saved, SequenceState& s) {
    HYMOE_CHECK(s.device != nullptr && s.device->owner == this,
                "load_kda_states: a sequence not made by this model's new_sequence()");
    const int64_t n = n_kda_ * (s_floats_ + tail_floats_);
    const int64_t got = saved.view().shape.empty() ? 0 : saved.view().numel();
    HYMOE_CHECK(got == n && (n == 0 || saved.view().dtype == DType::f32),
                "load_kda_states: ",
                got,
                " values where this model's KDA block holds ",
                n,
                " floats");
    if (n == 0)
        return;
    Tensor state{kda_state_of(*s.device), DType::f32, o_.device, {n}};
    ops::upload(ctx(), saved.view(), state);
    ops::synchronize(ctx());  // saved may go once this returns
}

int64_t DeviceModelOn::row_floats() const {
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

int64_t DeviceModelOn::fused_bytes(int64_t rows) const {
    // selections, plan scratch
    return o_.fused && o_.dtype == DType::bf16
               ? std::max(moe_fused_bytes(cfg_, rows), dsa_fused_bytes(cfg_, rows, n_sm_))
               : 0;
}

int64_t DeviceModelOn::step_bytes() const {
    const int64_t T = o_.max_tokens, B = o_.max_seqs, V = cfg_.vocab_size;
    // a logits row, and under tp the head's own columns and the gathered blocks (vocab_logits)
    const int64_t logits_row = V + (shard_.tp > 1 ? V / shard_.tp + V : 0);
    const int64_t per_row = row_floats() + (o_.logits_all ? logits_row : 0);
    return 4 * (T * per_row + B * logits_row) + (int64_t{256} << 20) + fused_bytes(T);  // + scores
}

int64_t DeviceModelOn::kv_room() const {
    const int64_t seqs = int64_t{o_.max_seqs} * sequence_floats() * 4;
    const int64_t left =
        static_cast<int64_t>(owned_->capacity() - owned_->used()) - step_bytes() - seqs;
    return std::max<int64_t>(left, 0);
}

int64_t DeviceModelOn::kv_page_budget(int64_t page_bytes) const {
    return kv_room() / std::max<int64_t>(page_bytes, 1);
}

int64_t DeviceModelOn::host_kv_page_budget(int64_t page_bytes, int64_t host_bytes) const {
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
    return std::min(host, kv_room() / std::max<int64_t>(host_kv_slot_bytes(one), 1));
}

std::unique_ptr<KvStore> DeviceModelOn::host_kv_store(const KvLayout& layout) {
    return file_kv_store(layout, -1);
}

std::unique_ptr<KvStore> DeviceModelOn::file_kv_store(const KvLayout& layout, int fd) {
#ifdef HYMOE_CUDA
    if (o_.device == Device::cuda)
        return make_host_kv_store(layout, ctx(), fd);
#endif
    HYMOE_FAIL_ONE(Exit::internal,
                   "the host and file KV tiers of a model on a device need a GPU; on the CPU the "
                   "KvPool's own tiers hold the pages (fd ",
                   fd,
                   ", ",
                   layout.capacity,
                   " pages)");
}

int64_t host_kv_slot_bytes(const KvLayout& layout) {
    const KvTierLayout at(layout);
    return at.n_slots * at.slot_floats * static_cast<int64_t>(sizeof(float));
}

void DeviceModelOn::encode_images(const std::vector<VisionImage>& images,
                                  int pool,
                                  Tensor& out,
                                  VisionStats* stats) {
    HYMOE_CHECK(vision_ != nullptr, "device model: images for a model without a vision tower");
    // between steps: the room a step keeps free holds a pass
    const int64_t room = o_.vision_scratch_bytes > 0 ? o_.vision_scratch_bytes : step_bytes();
    vision_->encode(images, pool, room, out, stats);
}

std::string DeviceModelOn::describe() const {
    const double gb = 1e-9;
    return cat(o_.device == Device::cuda ? "GPU" : "CPU",
               " model: ",
               to_string(o_.dtype),
               " matrices, weights ",
               static_cast<double>(weight_bytes_) * gb,
               " GB, ",
               static_cast<double>(owned_->capacity()) * gb,
               o_.device == Device::cuda ? " GB device arena" : " GB budget beside them",
               shard_.ep > 1 ? cat(", routed experts over ep ",
                                   shard_.ep,
                                   o_.ep_overlap ? " (two micro-batches)" : "")
                             : std::string(),
               shard_.pp > 1 ? cat(", pipeline stage ",
                                   shard_.stage,
                                   " of ",
                                   shard_.pp,
                                   " (layers ",
                                   shard_.first_layer,
                                   "..",
                                   shard_.end_layer - 1,
                                   ")")
                             : std::string());
}

}  // namespace dev

std::unique_ptr<DeviceModel> make_device_model(const Model& host,
                                               const DeviceModelOptions& options) {
    return std::make_unique<dev::DeviceModelOn>(host, options);
}

}  // namespace hymoe::model
