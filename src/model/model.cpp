// The model of one rank: random init and loading of its part of the weight list
// (model/tensor_list.h, the cut of model/shard.h), the one loop over a stage's layers (layer.h,
// shared by inference on any device and training), the vocab-parallel head and the residual
// stream's hand-over between stages. The inference forward is forward.cpp.
#include "hymoe/model/model.h"

#include <algorithm>

#include "hymoe/backend/ops.h"
#include "hymoe/backend/ops_attention.h"
#include "hymoe/backend/ops_rows.h"
#include "hymoe/core/timer.h"
#include "hymoe/model/kv_cache.h"
#include "layer.h"

namespace hymoe::model {

uint32_t name_stream(const std::string& name) {
    uint32_t h = 2166136261u;
    for (unsigned char c : name)
        h = (h ^ c) * 16777619u;
    return h;
}

Model make_model(const ModelConfig& cfg) {
    Model m;
    m.cfg = cfg;
    m.shard = whole_model(cfg);
    m.local = cfg;
    m.layers.resize(cfg.layers.size());
    return m;
}

Model make_model(const ModelConfig& cfg, const parallel::Grid& grid) {
    Model m = make_model(cfg);
    m.shard = make_shard(cfg, grid.layout, grid.me);
    m.local = local_config(cfg, m.shard);
    m.comms = &grid.comms;
    return m;
}

namespace {

// The whole shape of a tensor this rank holds part of.
Shape full_shape(const TensorSpec& spec, const ModelShard& sh) {
    Shape s = spec.shape;
    if (spec.split_dim >= 0)
        s[spec.split_dim] *= sh.parts(spec.split_over);
    return s;
}

// dest = the part of whole [.., full, ..] along part.dim that starts at part.begin.
void copy_part(const Tensor& whole, const TensorPart& part, Tensor& dest) {
    int64_t outer = 1, inner = 1;
    for (int k = 0; k < part.dim; ++k)
        outer *= whole.shape[k];
    for (size_t k = part.dim + 1; k < whole.shape.size(); ++k)
        inner *= whole.shape[k];
    const int64_t n = dest.shape[part.dim], es = static_cast<int64_t>(dtype_size(dest.dtype));
    for (int64_t o = 0; o < outer; ++o)
        std::copy_n(whole.ptr<char>() + (o * part.full + part.begin) * inner * es,
                    n * inner * es,
                    dest.ptr<char>() + o * n * inner * es);
}

}  // namespace

TensorPart part_of(const TensorSpec& spec, const ModelShard& sh) {
    if (spec.split_dim < 0)
        return {};
    const int64_t n = spec.shape[spec.split_dim];
    return {spec.split_dim, n * sh.part(spec.split_over), n * sh.parts(spec.split_over)};
}

void init_tensors_random(const TensorList& list, const ModelShard& shard, uint64_t seed) {
    for (const TensorSpec& spec : list) {
        Philox rng(seed, name_stream(spec.name), 0);
        const TensorPart part = part_of(spec, shard);
        if (part.dim < 0 || part.full == spec.shape[part.dim]) {
            init_random({spec}, rng);
            continue;
        }
        Buffer whole;
        TensorSpec whole_spec = spec;
        whole_spec.shape = full_shape(spec, shard);
        whole_spec.dest = &whole;
        init_random({whole_spec}, rng);
        *spec.dest = Buffer(spec.dtype, spec.shape);
        copy_part(whole.view(), part, spec.dest->view());
    }
}

void load_tensors(const TensorList& list, const ModelShard& shard, const ReadTensor& read) {
    for (const TensorSpec& spec : list) {
        *spec.dest = Buffer(spec.dtype, spec.shape);
        read(spec.name, part_of(spec, shard), spec.dest->view());
    }
}

void init_model_random(Model& m, uint64_t seed) {
    init_tensors_random(model_tensors(m), m.shard, seed);
}

void load_model_weights(Model& m, const ReadTensor& read) {
    load_tensors(model_tensors(m), m.shard, read);
}

SequenceState make_sequence_state(const Model& m) {
    SequenceState s;
    s.kda.resize(m.cfg.layers.size());
    s.attn.resize(m.cfg.layers.size());
    for (int i = m.shard.first_layer; i < m.shard.end_layer; ++i)
        if (m.cfg.layers[i].mixer == Mixer::kda)
            s.kda[i] = make_kda_state(m.local);
    return s;
}

void attach_kv_pool(const Model& m, SequenceState& s, KvPool& pool) {
    for (int i = m.shard.first_layer; i < m.shard.end_layer; ++i)
        if (m.cfg.layers[i].mixer != Mixer::kda)
            s.attn[i].pool = &pool, s.attn[i].pages = &s.pages, s.attn[i].layer = i;
}

namespace {

// Adds the GEMM FLOPs and GEMM seconds of its lifetime to a layer's totals (per-layer profile).
struct FlopSpan {
    double &flops, &seconds;
    double start = ops::gemm_counter().flops, start_seconds = ops::gemm_counter().seconds;
    FlopSpan(double& f, double& s) : flops(f), seconds(s) {}
    ~FlopSpan() {
        flops += ops::gemm_counter().flops - start;
        seconds += ops::gemm_counter().seconds - start_seconds;
    }
    FlopSpan(const FlopSpan&) = delete;
    FlopSpan& operator=(const FlopSpan&) = delete;
};

}  // namespace

namespace detail {

void vocab_logits(const backend::Ctx& ctx,
                  const Tensor& x,
                  const Tensor& head,
                  const comm::Comm* tp,
                  Tensor& logits) {
    if (tp == nullptr)
        return ops::linear(ctx, x, head, logits);
    const int64_t k = x.dim(0), n = tp->size(), part = head.dim(0);
    backend::Scratch s(ctx);
    Tensor mine = s(DType::f32, {k, part}), all = s(DType::f32, {n * k, part});
    ops::linear(ctx, x, head, mine);
    ops::synchronize(ctx);
    comm::all_gather(mine, all, *tp);
    std::vector<int64_t> order(static_cast<size_t>(k * n));  // [k·tp] gathered row of each
    for (int64_t i = 0; i < k; ++i)
        for (int64_t p = 0; p < n; ++p)
            order[static_cast<size_t>(i * n + p)] = p * k + i;
    Tensor idx = s(DType::i64, {k * n});
    ops::upload(ctx, Tensor{order.data(), DType::i64, Device::cpu, {k * n}}, idx);
    Tensor blocks{logits.data, DType::f32, logits.device, {k * n, part}};
    ops::gather_rows(ctx, all, idx, blocks);
}

double LayerBlocks::clock() const {
    return wall_seconds();
}

void run_layers(const ModelConfig& cfg,
                int first,
                int end,
                bool moe_collective,
                LayerBlocks& blocks,
                Tensor& h,
                ForwardStats& stats,
                const LayerTaps& taps) {
    const backend::Ctx& ctx = blocks.ctx();
    const int64_t n = h.dim(0), d = cfg.hidden_size;
    const auto n_layer = cfg.layers.size();
    stats.mixer_seconds.resize(n_layer);
    stats.ffn_seconds.resize(n_layer);
    stats.moe.resize(n_layer);
    stats.layer_flops.resize(n_layer);
    stats.layer_gemm_seconds.resize(n_layer);
    const float eps = static_cast<float>(cfg.rms_norm_eps);
    const bool has_rows = n > 0;  // the same on every rank of the dp replica
    stats.steps += has_rows ? 1 : 0;
    backend::Scratch scratch(ctx);
    Tensor xn = scratch(DType::f32, {n, d}), y = scratch(DType::f32, {n, d});  // [n, d] normed
                                                                               //   input, block out
    for (int i = first; i < end; ++i) {
        const bool moe = cfg.layers[i].ffn != Ffn::dense;
        if (!has_rows && !(moe && moe_collective))
            continue;
        const FlopSpan flop_span(stats.layer_flops[i], stats.layer_gemm_seconds[i]);
        const double t0 = blocks.clock();
        if (has_rows) {
            if (taps.before_mixer)
                taps.before_mixer(i, h);
            ops::rms_norm(ctx, h, blocks.attn_norm(i), eps, xn);
            blocks.mixer(i, xn, y);
            ops::add_inplace(ctx, h, y);
            if (taps.before_ffn)
                taps.before_ffn(i, h);
        }
        const double t1 = blocks.clock();
        stats.mixer_seconds[i] += t1 - t0;
        if (has_rows)
            ops::rms_norm(ctx, h, blocks.ffn_norm(i), eps, xn);
        if (moe && taps.moe_input)
            taps.moe_input(i, xn);
        blocks.ffn(i, xn, y, &stats.moe[i]);
        if (has_rows)
            ops::add_inplace(ctx, h, y);
        stats.ffn_seconds[i] += blocks.clock() - t1;
    }
}

}  // namespace detail

comm::Request send_to_next_stage(const Model& m, const Buffer& h) {
    if (m.shard.last_stage() || h.view().numel() == 0)
        return comm::Request();
    return comm::send_start(h.view(), m.comms->pp_next, m.comms->pp, 0);
}

}  // namespace hymoe::model
