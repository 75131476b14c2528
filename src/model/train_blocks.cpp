// A training pass's blocks on a Ctx and the reverse layer loop (train_blocks.h).
#include "train_blocks.h"

#include <numeric>

#include "hymoe/backend/ops.h"
#include "hymoe/backend/ops_attention.h"
#include "hymoe/backend/ops_backward.h"
#include "hymoe/backend/ops_rows.h"
#include "hymoe/model/attention_backward_views.h"
#include "hymoe/model/attention_views.h"
#include "hymoe/model/ffn_views.h"
#include "hymoe/model/kda_backward_views.h"
#include "hymoe/model/kda_views.h"
#include "hymoe/model/moe_parallel.h"

namespace hymoe::model::detail {

namespace {

using backend::Held;

// Zero KDA states and conv tails [n_seq] of cfg's heads on ctx's device: fresh sequences.
struct FreshKdaStates {
    std::vector<Held> held;            // [n_seq, 4] S, q, k, v tails
    std::vector<KdaStateViews> views;  // [n_seq]
    FreshKdaStates(const backend::Ctx& ctx, const ModelConfig& cfg, int64_t n_seq) {
        const int64_t H = cfg.kda.n_head, K = cfg.kda.head_dim, D = H * K;
        const int64_t W = cfg.kda.conv_kernel;
        for (int64_t s = 0; s < n_seq; ++s) {
            held.emplace_back(ctx, DType::f32, Shape{H, K, K});
            for (int p = 0; p < 3; ++p)
                held.emplace_back(ctx, DType::f32, Shape{W - 1, D});
        }
        for (int64_t s = 0; s < n_seq; ++s) {
            Held* h = &held[static_cast<size_t>(4 * s)];
            views.push_back({h[0].view(), h[1].view(), h[2].view(), h[3].view()});
        }
    }
};

// dh += ∂ through x ↦ norm(x; w) of dxn, at the block input x [n, d].
void add_norm_backward(const backend::Ctx& ctx,
                       const Tensor& x,
                       const Tensor& w,
                       float eps,
                       const Tensor& dxn,
                       Tensor& dh) {
    backend::Scratch s(ctx);
    Tensor dx = s(DType::f32, x.shape);
    ops::rms_norm_backward(ctx, x, w, eps, dxn, dx);
    ops::add_inplace(ctx, dh, dx);
}

}  // namespace

TrainBlocks::TrainBlocks(const TrainOn& on, const SeqBatch& batch) : on_(on), batch_(batch) {
    std::vector<int64_t> rows(static_cast<size_t>(batch.n_tok()));  // [n] every row: adapter 0
    std::iota(rows.begin(), rows.end(), int64_t{0});
    all_rows_ = Held(on.ctx, DType::i64, {batch.n_tok()});
    ops::upload(
        on.ctx, Tensor{rows.data(), DType::i64, Device::cpu, {batch.n_tok()}}, all_rows_.view());
    lora_rows_.push_back({0, all_rows_.view()});
    std::vector<int64_t> pos(rows.size());  // [n] every sequence from position 0
    for (int64_t q = 0; q < batch.n_seq(); ++q)
        for (int64_t t = batch.offsets[q]; t < batch.offsets[q + 1]; ++t)
            pos[static_cast<size_t>(t)] = t - batch.offsets[q];
    pos_ = Held(on.ctx, DType::i64, {batch.n_tok()});
    ops::upload(on.ctx, Tensor{pos.data(), DType::i64, Device::cpu, {batch.n_tok()}}, pos_.view());
}

MlaWeightViews TrainBlocks::mla_views(int i) const {
    MlaWeightViews w = on_.weights.layers[i].mla;
    w.lora_rows = &lora_rows_;
    return w;
}

void TrainBlocks::tp_sum(Tensor& x) const {
    if (on_.m.shard.tp == 1)
        return;
    ops::synchronize(on_.ctx);
    comm::all_reduce(x, on_.m.comms->tp);
}

void TrainBlocks::mixer(int i, const Tensor& xn, Tensor& y) {
    const Model& m = on_.m;
    const LayerViews& w = on_.weights.layers[i];
    const LayerSpec& spec = m.local.layers[i];
    if (spec.mixer == Mixer::kda) {
        const FreshKdaStates fresh(on_.ctx, m.local, batch_.n_seq());
        backend::Scratch s(on_.ctx);
        const ops::KdaSeqTable table =
            kda_table_on(on_.ctx, s, kda_table_arrays(batch_, fresh.views));
        kda_forward(on_.ctx, m.local, w.kda, xn, KdaBatchViews{&batch_, table, &lora_rows_}, y);
    } else {
        attention_forward(on_.ctx,
                          m.local,
                          spec,
                          mla_views(i),
                          xn,
                          AttnBatchViews{&batch_, pos_.view()},
                          y,
                          m.shard.tp > 1 ? &m.comms->tp : nullptr);
    }
    tp_sum(y);
}

void TrainBlocks::mixer_backward(int i, const Tensor& xn, const Tensor& dy, Tensor& dxn) {
    const Model& m = on_.m;
    const LayerSpec& spec = m.local.layers[i];
    if (spec.mixer == Mixer::kda)
        kda_backward(on_.ctx,
                     m.local,
                     on_.weights.layers[i].kda,
                     xn,
                     KdaBatchViews{&batch_, {}, &lora_rows_},
                     dy,
                     dxn);
    else
        attention_backward(on_.ctx,
                           m.local,
                           spec,
                           mla_views(i),
                           xn,
                           AttnBatchViews{&batch_, pos_.view()},
                           dy,
                           dxn,
                           m.shard.tp > 1 ? &m.comms->tp : nullptr);
    tp_sum(dxn);
}

void TrainBlocks::ffn(int i, const Tensor& xn, Tensor& y, MoeCommStats* stats) {
    const Model& m = on_.m;
    const LayerViews& w = on_.weights.layers[i];
    const LayerSpec& spec = m.local.layers[i];
    if (spec.ffn == Ffn::dense) {
        dense_ffn_forward(on_.ctx, w.dense, ExpertAct::swiglu, xn, y, nullptr, &lora_rows_);
        tp_sum(y);
    } else {  // the tp sum is the MoE path's own (it also places each etp block's rows)
        moe_forward_parallel(on_.ctx,
                             m.cfg,
                             spec,
                             w.moe,
                             xn,
                             y,
                             moe_groups(m),
                             stats,
                             nullptr,
                             nullptr,
                             &lora_rows_);
    }
}

void TrainBlocks::ffn_backward(int i, const Tensor& xn, const Tensor& dy, Tensor& dxn) {
    const Model& m = on_.m;
    const LayerSpec& spec = m.local.layers[i];
    if (spec.ffn == Ffn::dense) {
        dense_ffn_backward(
            on_.ctx, on_.weights.layers[i].dense, ExpertAct::swiglu, xn, dy, dxn, &lora_rows_);
        tp_sum(dxn);
    } else {
        moe_backward_parallel(on_.ctx,
                              m.cfg,
                              spec,
                              on_.weights.layers[i].moe,
                              xn,
                              dy,
                              dxn,
                              moe_groups(m),
                              nullptr,
                              nullptr,
                              &lora_rows_);
    }
}

void run_layers_backward(const ModelConfig& cfg,
                         int first,
                         int end,
                         TrainBlocks& blocks,
                         TrainStream& st,
                         bool recompute,
                         Tensor& dh) {
    const backend::Ctx& ctx = blocks.ctx();
    const int64_t n = dh.dim(0), d = cfg.hidden_size;
    const float eps = static_cast<float>(cfg.rms_norm_eps);
    backend::Scratch s(ctx);
    Tensor xn = s(DType::f32, {n, d}), xn2 = s(DType::f32, {n, d}), dxn = s(DType::f32, {n, d});
    for (int i = end - 1; i >= first; --i) {
        Held& h_in = st.before_mixer[i];
        ops::rms_norm(ctx, h_in.view(), blocks.attn_norm(i), eps, xn);
        if (recompute) {  // the FFN's input: rerun the mixer
            st.before_ffn[i] = Held(ctx, DType::f32, {n, d});
            blocks.mixer(i, xn, st.before_ffn[i].view());
            ops::add_inplace(ctx, st.before_ffn[i].view(), h_in.view());
        }
        // h_out = h_mid + ffn(norm h_mid)
        Held& h_mid = st.before_ffn[i];
        ops::rms_norm(ctx, h_mid.view(), blocks.ffn_norm(i), eps, xn2);
        blocks.ffn_backward(i, xn2, dh, dxn);
        add_norm_backward(ctx, h_mid.view(), blocks.ffn_norm(i), eps, dxn, dh);
        h_mid = Held();
        // h_mid = h_in + mixer(norm h_in)
        blocks.mixer_backward(i, xn, dh, dxn);
        add_norm_backward(ctx, h_in.view(), blocks.attn_norm(i), eps, dxn, dh);
        h_in = Held();
    }
}

}  // namespace hymoe::model::detail
