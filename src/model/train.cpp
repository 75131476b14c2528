// The whole-model training pass: each stage's forward keeping the residual stream at block
// boundaries, the masked cross-entropy head, the reverse sweep through each block's backward with
// the tp reductions, and the 1F1B schedule that moves the stream and its gradient between stages.
#include "hymoe/model/train.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <functional>

#include "hymoe/backend/held.h"
#include "hymoe/backend/ops.h"
#include "hymoe/backend/ops_attention.h"
#include "hymoe/backend/ops_backward.h"
#include "hymoe/backend/ops_router_loss.h"
#include "hymoe/backend/ops_rows.h"
#include "hymoe/core/error.h"
#include "hymoe/model/model_views.h"
#include "train_blocks.h"

namespace hymoe::model {

namespace {

constexpr int64_t kHeadRows = 256;  // LM head rows per chunk: bounds the [rows, V] logits
constexpr int kStreamTag = 0;       // pp messages: the residual stream, forward
constexpr int kGradTag = 1;         //              its gradient, backward

void check_batch(const TrainBatch& b) {
    HYMOE_CHECK(b.tokens.size() == b.targets.size() &&
                    static_cast<int64_t>(b.tokens.size()) == b.batch.n_tok(),
                "train: ",
                b.tokens.size(),
                " tokens, ",
                b.targets.size(),
                " targets for a batch of ",
                b.batch.n_tok());
    for (int64_t p : b.batch.pos0)
        HYMOE_CHECK(p == 0, "train: every sequence of a training batch starts at position 0");
}

// x ← Σ over tp of x (the head's dnormed partials), after the stream's work on it.
void tp_sum(const TrainOn& on, Tensor& x) {
    if (on.m.shard.tp == 1)
        return;
    ops::synchronize(on.ctx);
    comm::all_reduce(x, on.m.comms->tp);
}

void set_dropout_seed(const TrainOptions& o, const TrainBatch& b) {
    for (LoraSlot* slot : o.dropout_slots)
        slot->dropout_seed = b.dropout_seed;
}

using Stream = detail::TrainStream;  // one micro-batch's, at the stage's block boundaries
using backend::Held;

// The stage's input stream [n, d] on the pass's device: the embeddings with the media spliced in
// (first stage), or the previous stage's output.
Held stage_input(const TrainOn& on, const TrainBatch& b) {
    const Model& m = on.m;
    Held h(on.ctx, DType::f32, {b.batch.n_tok(), m.cfg.hidden_size});
    if (m.shard.first_stage()) {
        detail::check_tokens(m.cfg, b.tokens);
        detail::embed_input(on, b.tokens, &b.media, h.view());
    } else {
        detail::recv_on(on.ctx, h.view(), m.comms->pp_prev, m.comms->pp, kStreamTag);
    }
    return h;
}

// What a stage's forward keeps of the residual stream for its backward.
enum class Keep { nothing, inputs, inputs_and_mid };  // each layer's input (and before its FFN)

// This stage's layers on h (the model's one layer loop, every sequence fresh), keeping what
// `keep` says; expert_load (when given) adds each MoE layer's expert load; moe_input (when given)
// is called with each MoE layer's normed input [n, d] as the loop passes it.
Stream forward_stage(const TrainOn& on,
                     const TrainBatch& b,
                     Held h,
                     Keep keep,
                     std::vector<std::vector<int64_t>>* expert_load,
                     const std::function<void(int, const Tensor&)>& moe_input) {
    const Model& m = on.m;
    const ModelShard& sh = m.shard;
    Stream st;
    st.before_mixer.resize(m.cfg.layers.size());
    st.before_ffn.resize(m.cfg.layers.size());
    auto copy = [&](const Tensor& x) {
        Held c(on.ctx, DType::f32, x.shape);
        ops::cast(on.ctx, x, c.view());
        return c;
    };
    detail::LayerTaps taps;
    if (keep != Keep::nothing)
        taps.before_mixer = [&](int i, const Tensor& x) { st.before_mixer[i] = copy(x); };
    if (keep == Keep::inputs_and_mid)
        taps.before_ffn = [&](int i, const Tensor& x) { st.before_ffn[i] = copy(x); };
    taps.moe_input = moe_input;
    ForwardStats stats;
    detail::TrainBlocks blocks(on, b.batch);
    detail::run_layers(
        m.local, sh.first_layer, sh.end_layer, sh.tp * sh.ep > 1, blocks, h.view(), stats, taps);
    if (expert_load && sh.etp_rank == 0)
        for (size_t i = 0; i < stats.moe.size(); ++i) {  // empty for the dense layers
            const std::vector<int64_t>& load = stats.moe[i].tokens_per_expert;
            std::vector<int64_t>& acc = (*expert_load)[i];
            acc.resize(std::max(acc.size(), load.size()));
            for (size_t e = 0; e < load.size(); ++e)
                acc[e] += load[e];
        }
    st.out = std::move(h);
    return st;
}

// The masked cross-entropy over the rows with a target, and (when dh is given) ∂(scale·Σ loss)
// with respect to the last residual stream h [n, d]. Under tp every rank computes the loss from
// the gathered logits and the gradient through its V/tp head rows, summed over tp.
LossSums loss_head(
    const TrainOn& on, const TrainBatch& b, const Tensor& h, double scale, Held* dh) {
    const Model& m = on.m;
    const backend::Ctx& ctx = on.ctx;
    const int64_t n = b.batch.n_tok(), d = m.cfg.hidden_size, V = m.cfg.vocab_size;
    const float eps = static_cast<float>(m.cfg.rms_norm_eps);
    std::vector<int64_t> rows;  // rows with a target
    for (int64_t t = 0; t < n; ++t)
        if (b.targets[t] >= 0)
            rows.push_back(t);
    backend::Scratch s(ctx);
    Tensor normed = s(DType::f32, {n, d});
    ops::rms_norm(ctx, h, on.weights.final_norm, eps, normed);
    Held dnormed(ctx, DType::f32, {n, d});  // zero on rows without a target
    std::vector<uint8_t> right(static_cast<size_t>(n), 1);
    LossSums sums;
    const Tensor& head = on.weights.head;  // [V/tp, d] this rank's vocabulary rows
    const int64_t part = head.dim(0), lo = part * m.shard.tp_rank;
    for (size_t c = 0; c < rows.size(); c += kHeadRows) {
        const int64_t k = std::min<int64_t>(kHeadRows, static_cast<int64_t>(rows.size() - c));
        backend::Scratch cs(ctx);
        std::vector<int64_t> target(static_cast<size_t>(k));  // [k]
        for (int64_t r = 0; r < k; ++r) {
            target[r] = b.targets[rows[c + r]];
            HYMOE_CHECK(target[r] < V, "train: target id ", target[r], " outside the vocabulary");
        }
        Tensor chunk_rows = cs(DType::i64, {k}), target_dev = cs(DType::i64, {k});  // [k]
        ops::upload(ctx, Tensor{rows.data() + c, DType::i64, Device::cpu, {k}}, chunk_rows);
        ops::upload(ctx, Tensor{target.data(), DType::i64, Device::cpu, {k}}, target_dev);
        Tensor x = cs(DType::f32, {k, d}), logits = cs(DType::f32, {k, V});
        ops::gather_rows(ctx, normed, chunk_rows, x);
        detail::vocab_logits(ctx, x, head, m.shard.tp > 1 ? &m.comms->tp : nullptr, logits);
        // the rows' losses; logits ← dlogits = scale·(softmax − onehot)
        const ops::CrossEntropyRows ce = ops::cross_entropy_rows(ctx, logits, target_dev, scale);
        for (int64_t r = 0; r < k; ++r) {
            sums.loss += ce.loss[r];
            sums.targets += 1;
            sums.correct += ce.best[r] == target[r];
            right[rows[c + r]] = ce.best[r] == target[r];
        }
        if (!dh)
            continue;
        // dx [k, d] = dlogits[:, lo : lo + part] · head (this rank's columns; all of them at tp 1)
        Tensor mine = logits;
        if (part != V) {
            mine = cs(DType::f32, {k, part});
            ops::copy_cols(ctx, logits, lo, mine);
        }
        Tensor dx = cs(DType::f32, {k, d});
        ops::linear_backward(ctx, mine, head, dx);
        ops::scatter_rows(ctx, dx, chunk_rows, dnormed.view());
    }
    for (int64_t q = 0; q < b.batch.n_seq(); ++q) {
        bool any = false, all = true;
        for (int64_t t = b.batch.offsets[q]; t < b.batch.offsets[q + 1]; ++t)
            if (b.targets[t] >= 0)
                any = true, all = all && right[t];
        sums.seqs += any;
        sums.seqs_correct += any && all;
    }
    if (dh) {
        tp_sum(on, dnormed.view());
        *dh = Held(ctx, DType::f32, {n, d});
        ops::rms_norm_backward(ctx, h, on.weights.final_norm, eps, dnormed.view(), dh->view());
    }
    return sums;
}

// The loss sums of the last stage on every rank of the pipeline.
LossSums share_over_pipeline(const Model& m, const LossSums& s) {
    if (m.shard.pp == 1)
        return s;
    std::vector<double> v = {s.loss,
                             static_cast<double>(s.targets),
                             static_cast<double>(s.correct),
                             static_cast<double>(s.seqs),
                             static_cast<double>(s.seqs_correct)};
    if (!m.shard.last_stage())
        std::fill(v.begin(), v.end(), 0.0);
    comm::all_reduce_sum(v, m.comms->pp);
    LossSums out;
    out.loss = v[0], out.targets = static_cast<int64_t>(v[1]);
    out.correct = static_cast<int64_t>(v[2]), out.seqs = static_cast<int64_t>(v[3]);
    out.seqs_correct = static_cast<int64_t>(v[4]);
    return out;
}

// Point-to-point sends in flight: each tensor stays alive until its send completes.
class Outbox {
public:
    explicit Outbox(const backend::Ctx& ctx) : ctx_(ctx) {}
    void send(Held x, int dest, const comm::Comm& c, int tag) {
        Pending& p = pending_.emplace_back();
        p.data = std::move(x);
        p.request = detail::send_start_on(ctx_, p.data.view(), p.staged, dest, c, tag);
    }
    ~Outbox() {
        for (Pending& p : pending_)
            p.request.wait();
    }

private:
    struct Pending {
        Held data;
        Buffer staged;  // a device tensor's host copy
        comm::Request request;
    };
    const backend::Ctx& ctx_;
    std::deque<Pending> pending_;  // stable addresses
};

// A forward-only pass of one batch through the pipeline, keeping nothing for a backward; on the
// last stage, the stream out. moe_input: forward_stage's.
Stream forward_only(const TrainOn& on,
                    const TrainBatch& b,
                    const std::function<void(int, const Tensor&)>& moe_input = {}) {
    check_batch(b);
    Stream st = forward_stage(on, b, stage_input(on, b), Keep::nothing, nullptr, moe_input);
    if (!on.m.shard.last_stage()) {
        Buffer staged;
        detail::send_start_on(
            on.ctx, st.out.view(), staged, on.m.comms->pp_next, on.m.comms->pp, kStreamTag)
            .wait();
    }
    return st;
}

// The CPU's training target: m's own weights, adapters as its host slots.
struct HostTarget {
    ModelViews views;
    TrainOn on;
    explicit HostTarget(const Model& m) : views(host_views(m)), on{m, m.ctx, views} {}
    HostTarget(const HostTarget&) = delete;
    HostTarget& operator=(const HostTarget&) = delete;
};

}  // namespace

void LossSums::add(const LossSums& o) {
    loss += o.loss;
    targets += o.targets;
    correct += o.correct;
    seqs += o.seqs;
    seqs_correct += o.seqs_correct;
}

LossSums train_forward_backward(const TrainOn& on,
                                std::span<const TrainBatch> micro,
                                const TrainOptions& options) {
    const Model& m = on.m;
    const ModelShard& sh = m.shard;
    const auto n_micro = static_cast<int64_t>(micro.size());
    LossSums sums;
    Outbox outbox(on.ctx);
    std::deque<Stream> in_flight;  // forwards whose backward is still to come, oldest first
    std::deque<Held> head_grads;   // last stage: ∂loss/∂(stage output) of those forwards
    int64_t next_forward = 0, next_backward = 0;
    auto forward = [&] {
        const TrainBatch& b = micro[next_forward++];
        check_batch(b);
        set_dropout_seed(options, b);
        Stream& st = in_flight.emplace_back(
            forward_stage(on,
                          b,
                          stage_input(on, b),
                          options.recompute ? Keep::inputs : Keep::inputs_and_mid,
                          options.expert_load,
                          {}));
        if (sh.last_stage()) {
            sums.add(
                loss_head(on, b, st.out.view(), options.grad_scale, &head_grads.emplace_back()));
        } else {
            outbox.send(std::move(st.out), m.comms->pp_next, m.comms->pp, kStreamTag);
        }
        st.out = Held();
    };
    auto backward = [&] {
        const TrainBatch& b = micro[next_backward++];
        set_dropout_seed(options, b);
        Held dh;
        if (sh.last_stage()) {
            dh = std::move(head_grads.front());
            head_grads.pop_front();
        } else {
            dh = Held(on.ctx, DType::f32, {b.batch.n_tok(), m.cfg.hidden_size});
            detail::recv_on(on.ctx, dh.view(), m.comms->pp_next, m.comms->pp, kGradTag);
        }
        detail::TrainBlocks blocks(on, b.batch);
        detail::run_layers_backward(m.local,
                                    sh.first_layer,
                                    sh.end_layer,
                                    blocks,
                                    in_flight.front(),
                                    options.recompute,
                                    dh.view());
        in_flight.pop_front();
        if (!sh.first_stage())
            outbox.send(std::move(dh), m.comms->pp_prev, m.comms->pp, kGradTag);
    };
    const int64_t warm_up = std::min<int64_t>(sh.pp - sh.stage - 1, n_micro);
    for (int64_t k = 0; k < warm_up; ++k)
        forward();
    while (next_forward < n_micro) {
        forward();
        backward();
    }
    while (next_backward < n_micro)
        backward();
    return share_over_pipeline(m, sums);
}

LossSums train_forward_backward(const Model& m,
                                std::span<const TrainBatch> micro,
                                const TrainOptions& options) {
    const HostTarget host(m);
    return train_forward_backward(host.on, micro, options);
}

LossSums evaluate_loss(const TrainOn& on, const TrainBatch& b) {
    const Stream st = forward_only(on, b);
    LossSums s;
    if (on.m.shard.last_stage())
        s = loss_head(on, b, st.out.view(), 1.0, nullptr);
    return share_over_pipeline(on.m, s);
}

LossSums evaluate_loss(const Model& m, const TrainBatch& b) {
    const HostTarget host(m);
    return evaluate_loss(host.on, b);
}

std::vector<Buffer> router_distributions(const TrainOn& on, const TrainBatch& b) {
    const Model& m = on.m;
    const int64_t n = b.batch.n_tok(), E = m.cfg.moe.n_routed_experts;
    std::vector<Buffer> dist(m.cfg.layers.size());
    // each MoE layer's router logits [n, E] as the pass reaches it, on the host
    forward_only(on, b, [&](int i, const Tensor& xn) {
        dist[i] = Buffer(DType::f32, {n, E});
        if (on.ctx.device == Device::cpu)
            return ops::linear(on.ctx, xn, on.weights.layers[i].moe.router, dist[i].view());
        backend::Scratch s(on.ctx);
        Tensor logits = s(DType::f32, {n, E});
        ops::linear(on.ctx, xn, on.weights.layers[i].moe.router, logits);
        ops::download(on.ctx, logits, dist[i].view());
    });
    for (size_t i = 0; i < dist.size(); ++i) {
        if (dist[i].view().data == nullptr)
            continue;
        float* p = dist[i].ptr<float>();
        if (m.cfg.moe.scoring == Scoring::softmax) {
            ops::softmax_rows(p, n, E);
            continue;
        }
        ops::sigmoid_inplace(dist[i].view());
        for (int64_t t = 0; t < n; ++t) {
            double z = 0;
            for (int64_t e = 0; e < E; ++e)
                z += static_cast<double>(p[t * E + e]);
            for (int64_t e = 0; e < E; ++e)
                p[t * E + e] = static_cast<float>(static_cast<double>(p[t * E + e]) / z);
        }
    }
    return dist;
}

std::vector<Buffer> router_distributions(const Model& m, const TrainBatch& b) {
    const HostTarget host(m);
    return router_distributions(host.on, b);
}

}  // namespace hymoe::model
