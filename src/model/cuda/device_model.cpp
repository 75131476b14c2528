// The GPU model (model/cuda_model.h), its setup: the weights uploaded once (the routed experts
// this rank hosts at ep > 1), the decode graphs' runner, LoRA adapters, the memory budgets (KV
// pages next to the weights, max_seqs KDA states and one step; or the host tier's pages), the
// prefix cache's copies of a sequence's KDA block, the vision encoder, and the factories. The class
// is cuda_model_impl.h; a step's batch on the device is device_step.cpp, the forward
// device_forward.cpp.
#include <algorithm>
#include <limits>
#include <memory>

#include "cuda_model_impl.h"
#include "hymoe/backend/cuda_ops.h"
#include "hymoe/model/fused_step.h"
#include "hymoe/parallel/comm.h"
#include "hymoe/parallel/comms.h"

namespace hymoe::model {

namespace gpu {

CudaModel::CudaModel(const Model& host, const CudaModelOptions& o)
    : cfg_(host.local), o_(o), shard_(host.shard), comms_(host.comms) {
    HYMOE_CHECK(
        host.comms != nullptr || (host.shard.tp == 1 && host.shard.pp == 1 && host.shard.ep == 1),
        "make_cuda_model: a rank's part of the model (tp ",
        host.shard.tp,
        ", pp ",
        host.shard.pp,
        ", ep ",
        host.shard.ep,
        ") without the grid's comms");
    const bool any_moe = count_layers(cfg_, Ffn::moe) + count_layers(cfg_, Ffn::latent_moe) > 0;
    HYMOE_CHECK(o.dtype == DType::f32 || o.dtype == DType::bf16,
                "make_cuda_model: matrices in ",
                to_string(o.dtype),
                " (f32 or bf16)");
    // a decode graph captures a whole step, embedding to head (one stage holds a part of it),
    // and no tp collectives
    o_.graphs = o.graphs && shard_.pp == 1 && shard_.tp == 1;
    shell_.cfg = host.cfg;
    shell_.shard = host.shard;
    shell_.local = host.local;
    shell_.comms = host.comms;
    const size_t arena_bytes =
        o.arena_bytes > 0
            ? o.arena_bytes
            : static_cast<size_t>(static_cast<double>(cu::device_free_bytes()) * o.memory_fraction);
    g_ = std::make_unique<Gpu>(arena_bytes, any_moe ? std::max(cfg_.moe.n_routed_experts, 1) : 1);
    ctx_ = ctx_of(*g_);
    const size_t before = g_->arena.book().used();
    views_ = model_views(host, upload_weights(*g_, host, o.dtype));  // the rank's part
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
        vision_ = std::make_unique<DeviceVision>(*g_, cfg_, host.vision, o.dtype);
    const int64_t D = int64_t{cfg_.kda.n_head} * cfg_.kda.head_dim;
    s_floats_ = D * cfg_.kda.head_dim;
    tail_floats_ = (cfg_.kda.conv_kernel - 1) * 3 * D;
    kda_slots_ = n_kda_ > 0 && g_->arena.book().capacity() /
                                       static_cast<size_t>(s_floats_ * int64_t{sizeof(float)}) <
                                   static_cast<size_t>(std::numeric_limits<int32_t>::max());
    weight_bytes_ = g_->arena.book().used() - before;
    graph_model_.ep = host.shard.ep;
    make_graphs();
}

void CudaModel::check_experts(const Model& host, int i) const {
    const LayerSpec& spec = cfg_.layers[i];
    if (spec.ffn == Ffn::dense)
        return;
    const int64_t n_exp = cfg_.moe.n_routed_experts;
    const std::vector<int> local = local_expert_index(
        host.layers[i].moe.expert_rank, n_exp, host.shard.ep, host.shard.ep_rank);
    const auto hosted = std::count_if(local.begin(), local.end(), [](int l) { return l >= 0; });
    HYMOE_CHECK(moe_[i].up.dim(0) == hosted,
                "make_cuda_model: layer ",
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

void CudaModel::make_graphs() {
    graph_model_.graphs = o_.graphs;
    graph_model_.fused = o_.fused;
    graph_model_.dtype = o_.dtype;
    graph_model_.kda_slots = kda_slots_;
    graph_model_.n_sm = cu::device_sm_count();
    graph_model_.max_key_bucket = key_bucket(1);
    while (graph_model_.max_key_bucket * 2 * std::max(cfg_.mla.n_head, 1) <= kScoreFloats)
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
                                               kScoreFloats * 4 + (int64_t{16} << 20));
    graphs_ = std::make_unique<DecodeGraphRunner>(
        *g_,
        buckets.max(),
        cfg_.vocab_size,
        workspace,
        KdaBlockShape{n_kda_, s_floats_, tail_floats_},
        kda_slots_ ? reinterpret_cast<float*>(g_->arena.base()) : nullptr,
        [this](const StepBatch& step, const Tensor& ids, Tensor& logits) {
            const ModelOn model = on();
            backend::Scratch s(ctx_);
            Tensor h = s(DType::f32, {step.n_tok, cfg_.hidden_size});  // [B, d]
            detail::embed_ids(model, ids, h);
            CudaStep states(cfg_, shard_, kda_index_, step, o_.dtype, nullptr);
            ForwardStats unused;  // no timings in a captured step
            detail::run_step_layers(model, *step.batch, states, {}, h, unused, false);
            detail::head_logits(model, h, logits);
        });
}

void CudaModel::set_lora_adapters(const Model& host) {
    HYMOE_CHECK(n_adapters_ == 0 && host.layers.size() == views_.layers.size(),
                "set_lora_adapters: once, from the model this one was made from");
    const size_t before = g_->arena.book().used();
    for (int i = shard_.first_layer; i < shard_.end_layer; ++i) {
        n_adapters_ = std::max(n_adapters_,
                               upload_layer_lora(*g_, host.layers[i], views_.layers[i], moe_[i]));
        if (cfg_.layers[i].ffn != Ffn::dense)  // the experts' adapters: their views anew
            views_.layers[i].moe = moe_views_of(moe_[i],
                                                o_.dtype,
                                                cfg_.moe.n_routed_experts,
                                                shard_.ep > 1 ? &comms_->ep : nullptr);
    }
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

Buffer CudaModel::save_kda_states(const SequenceState& s) {
    HYMOE_CHECK(s.device != nullptr && s.device->arena == &g_->arena,
                "save_kda_states: a sequence not made by this model's new_sequence()");
    if (n_kda_ == 0)
        return Buffer();
    const DeviceSequence& ds = *s.device;
    HYMOE_CHECK(ds.block != nullptr, "save_kda_states: a sequence no forward has seen");
    const int64_t n = n_kda_ * (s_floats_ + tail_floats_);  // the block: S, then the tails
    Buffer out(DType::f32, {n}, uninit);
    cu::copy_to_host(
        out.ptr<float>(), ds.state, static_cast<size_t>(n) * sizeof(float), g_->stream);
    g_->stream.synchronize();
    return out;
}

void CudaModel::load_kda_states(const Buffer& saved, SequenceState& s) {
    HYMOE_CHECK(s.device != nullptr && s.device->arena == &g_->arena,
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
    float* state = kda_state_of(*s.device);
    cu::copy_to_device(
        state, saved.ptr<float>(), static_cast<size_t>(n) * sizeof(float), g_->stream);
    g_->stream.synchronize();  // saved may go once this returns
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
    // a logits row, and under tp the head's own columns and the gathered blocks (vocab_logits)
    const int64_t logits_row = V + (shard_.tp > 1 ? V / shard_.tp + V : 0);
    const int64_t per_row = row_floats() + (o_.logits_all ? logits_row : 0);
    return 4 * (T * per_row + B * logits_row) + (int64_t{256} << 20) + fused_bytes(T);  // + scores
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
    return std::min(host, kv_room() / std::max<int64_t>(HostKvStore::slot_bytes(one), 1));
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

}  // namespace gpu

std::unique_ptr<DeviceModel> make_cuda_model(const Model& host, const CudaModelOptions& options) {
    return std::make_unique<gpu::CudaModel>(host, options);
}

DecodeGraphCounters decode_graph_counters(const DeviceModel& model) {
    const auto* m = dynamic_cast<const gpu::CudaModel*>(&model);
    HYMOE_CHECK(m != nullptr, "decode_graph_counters: not a model of make_cuda_model");
    return m->graph_counters();
}

void set_decode_graphs(DeviceModel& model, bool on) {
    auto* m = dynamic_cast<gpu::CudaModel*>(&model);
    HYMOE_CHECK(m != nullptr, "set_decode_graphs: not a model of make_cuda_model");
    m->set_graphs(on);
}

}  // namespace hymoe::model
