// The inference forward on any Ctx (model/model_on.h): the embedding, the stage's layers through
// the one loop (layer.h), the hand-over of the residual stream between stages (through host
// memory), the final norm and the head (or each last row's top tokens); and the host's step
// states (HostStep: the SequenceStates' KDA buffers and KvPool pages). The model on a device runs
// forward_step with its own step states (src/model/device, TableStep).
#include <algorithm>
#include <unordered_set>

#include "hymoe/backend/ops.h"
#include "hymoe/backend/ops_attention.h"
#include "hymoe/backend/ops_head.h"
#include "hymoe/backend/ops_rows.h"
#include "hymoe/core/allocator.h"
#include "hymoe/core/error.h"
#include "hymoe/core/timer.h"
#include "hymoe/model/kv_cache.h"
#include "layer.h"

namespace hymoe::model {

namespace detail {

namespace {

// The sequences' own states on the host, read by the pass's Ctx: each KDA layer's states by
// their buffers' addresses, each attention layer's KvPool caches, and each pool told the step's
// pages (the offload tier's prefetch), each attention layer as it starts and the step's end.
class HostStep final : public StepStates {
public:
    HostStep(const Model& m, const SeqBatch& batch, const std::vector<SequenceState*>& states)
        : m_(m), batch_(batch), states_(states) {
        std::vector<std::vector<int32_t>> pages;  // [pool] the step's pages, in block-table order
        for (const SequenceState* s : states)
            for (int i = m.shard.first_layer; i < m.shard.end_layer; ++i) {
                KvPool* pool = s->attn.empty() ? nullptr : s->attn[i].pool;
                if (pool == nullptr)
                    continue;
                const size_t k = std::find(pools_.begin(), pools_.end(), pool) - pools_.begin();
                if (k == pools_.size())
                    pools_.push_back(pool), pages.emplace_back();
                pages[k].insert(pages[k].end(), s->pages.begin(), s->pages.end());
                break;
            }
        for (size_t k = 0; k < pools_.size(); ++k) {  // block tables may share pages (a cached
            std::vector<int32_t> once;                //   prompt prefix): first occurrences
            std::unordered_set<int32_t> seen;
            for (int32_t p : pages[k])
                if (seen.insert(p).second)
                    once.push_back(p);
            pools_[k]->begin_step(once);
        }
    }
    KdaBatchViews kda(int i) override {
        std::vector<KdaStateViews> views;  // [n_seq]
        for (SequenceState* s : states_)
            views.push_back(kda_views(s->kda[i]));
        check_kda_states(m_.local, views);
        table_ = kda_table_arrays(batch_, views);
        return KdaBatchViews{&batch_, table_.table(), nullptr};
    }
    Attention attention(int i) override {
        for (KvPool* pool : pools_)
            pool->enter_layer(i);
        Attention a;
        for (SequenceState* s : states_)
            a.caches.push_back(&s->attn[i]);
        return a;
    }
    void leave_attention(int) override {}
    const std::vector<LoraRowsView>* lora_rows() const override { return nullptr; }
    const SeqBatch* ffn_rows() const override { return batch_.adapter.empty() ? nullptr : &batch_; }
    void end_step() override {
        for (KvPool* pool : pools_)
            pool->end_step();
    }

private:
    const Model& m_;
    const SeqBatch& batch_;
    const std::vector<SequenceState*>& states_;
    std::vector<KvPool*> pools_;  // the pools the step's caches page into
    KdaTableArrays table_;        // the last kda() call's table (host memory)
};

// v as a tensor on ctx's device: itself on the CPU, else a copy in s.
template <class T>
Tensor on_device(const backend::Ctx& ctx, backend::Scratch& s, const std::vector<T>& v, DType t) {
    const Tensor host{const_cast<T*>(v.data()), t, Device::cpu, {static_cast<int64_t>(v.size())}};
    if (ctx.device == Device::cpu)
        return host;
    Tensor dev = s(t, host.shape);
    ops::upload(ctx, host, dev);
    return dev;
}

// h [n, d]: rows media.rows replaced by media.embeds [n_media, d].
void splice_media(const backend::Ctx& ctx,
                  backend::Scratch& s,
                  const MediaSplice& media,
                  Tensor& h) {
    const int64_t d = h.dim(1), n = static_cast<int64_t>(media.rows.size());
    if (n == 0)
        return;
    const Tensor& embeds = media.embeds.view();
    HYMOE_CHECK(embeds.shape == (Shape{n, d}),
                "forward: ",
                n,
                " media rows for embeds of ",
                embeds.numel(),
                " floats");
    for (int64_t r : media.rows)
        HYMOE_CHECK(r >= 0 && r < h.dim(0), "forward: media row ", r, " outside the batch");
    Tensor rows = embeds;  // [n, d] on ctx's device
    if (ctx.device != Device::cpu) {
        rows = s(DType::f32, embeds.shape);
        ops::upload(ctx, embeds, rows);
    }
    ops::scatter_rows(ctx, rows, on_device(ctx, s, media.rows, DType::i64), h);
}

}  // namespace

void check_forward(const ModelConfig& cfg,
                   bool first_stage,
                   const std::vector<int64_t>& tokens,
                   const SeqBatch& batch,
                   const std::vector<SequenceState*>& states,
                   const ForwardOptions& options,
                   const TopLogits* top) {
    HYMOE_CHECK(static_cast<int64_t>(tokens.size()) == batch.n_tok() &&
                    static_cast<int64_t>(states.size()) == batch.n_seq(),
                "forward: ",
                tokens.size(),
                " tokens / ",
                states.size(),
                " states for a batch of ",
                batch.n_tok(),
                " tokens / ",
                batch.n_seq(),
                " sequences");
    for (int64_t s = 0; s < batch.n_seq(); ++s)
        HYMOE_CHECK(states[s]->n_tokens == batch.pos0[s],
                    "forward: sequence ",
                    s,
                    " state holds ",
                    states[s]->n_tokens,
                    " tokens but the batch continues at ",
                    batch.pos0[s]);
    const int64_t V = cfg.vocab_size;
    HYMOE_CHECK(top == nullptr || (options.logits == Logits::last && top->n >= 1 && top->n <= V),
                "forward: the rows reduced to their top ",
                top ? top->n : 0,
                " tokens need last-row logits and 1 ≤ n ≤ ",
                V);
    if (first_stage)
        check_tokens(cfg, tokens);
}

void check_tokens(const ModelConfig& cfg, const std::vector<int64_t>& tokens) {
    const int64_t V = cfg.vocab_size;
    for (int64_t t : tokens)
        HYMOE_CHECK(
            t >= 0 && t < V, "forward: token id ", t, " outside the vocabulary [0, ", V, ")");
}

void download_top(const backend::Ctx& ctx, backend::Scratch& s, const Tensor& out, TopLogits& top) {
    const int64_t r = out.dim(0), n = top.n;
    Tensor idx = s(DType::i64, {r, n}), values = s(DType::f32, {r, n});  // [r, n]
    Tensor sums = s(DType::i64, {r});  // [r] doubles (an 8-byte element type)
    ops::top_logits(ctx, out, idx, values, sums);
    top.tokens.resize(static_cast<size_t>(r * n));
    top.logits.resize(static_cast<size_t>(r * n));
    top.log_sum.resize(static_cast<size_t>(r));
    Tensor tokens{top.tokens.data(), DType::i64, Device::cpu, {r, n}};
    Tensor logits{top.logits.data(), DType::f32, Device::cpu, {r, n}};
    Tensor log_sum{top.log_sum.data(), DType::i64, Device::cpu, {r}};
    ops::download(ctx, idx, tokens);
    ops::download(ctx, values, logits);
    ops::download(ctx, sums, log_sum);
}

void embed_input(const ModelOn& on,
                 const std::vector<int64_t>& tokens,
                 const MediaSplice* media,
                 Tensor& h) {
    backend::Scratch s(on.ctx);
    embed_ids(on, on_device(on.ctx, s, tokens, DType::i64), h);
    if (media != nullptr)
        splice_media(on.ctx, s, *media, h);
}

comm::Request send_start_on(const backend::Ctx& ctx,
                            const Tensor& x,
                            Buffer& staged,
                            int dest,
                            const comm::Comm& c,
                            int tag) {
    if (x.device == Device::cpu)
        return comm::send_start(x, dest, c, tag);
    staged = Buffer(x.dtype, x.shape, uninit);
    ops::download(ctx, x, staged.view());
    return comm::send_start(staged.view(), dest, c, tag);
}

void recv_on(const backend::Ctx& ctx, Tensor& x, int src, const comm::Comm& c, int tag) {
    if (x.device == Device::cpu)
        return comm::recv(x, src, c, tag);
    Buffer staged(x.dtype, x.shape, uninit);
    comm::recv(staged.view(), src, c, tag);
    ops::upload(ctx, staged.view(), x);
}

void embed_ids(const ModelOn& on, const Tensor& ids, Tensor& h) {
    const Tensor& table = on.weights.embed;  // [V/tp, d] this rank's rows
    ops::embed_rows(on.ctx, table, ids, table.dim(0) * on.m.shard.tp_rank, h);
    if (on.m.shard.tp > 1) {
        ops::synchronize(on.ctx);  // comm:: runs outside the device's stream
        comm::all_reduce(h, on.m.comms->tp);
    }
}

void head_logits(const ModelOn& on, const Tensor& rows, Tensor& out) {
    backend::Scratch s(on.ctx);
    Tensor normed = s(DType::f32, rows.shape);  // [r, d]
    ops::rms_norm(
        on.ctx, rows, on.weights.final_norm, static_cast<float>(on.m.local.rms_norm_eps), normed);
    vocab_logits(
        on.ctx, normed, on.weights.head, on.m.shard.tp > 1 ? &on.m.comms->tp : nullptr, out);
}

void forward_step(const ModelOn& on,
                  const std::vector<int64_t>& tokens,
                  const SeqBatch& batch,
                  StepStates& step,
                  const std::vector<SequenceState*>& states,
                  Buffer& logits,
                  const ForwardOptions& options,
                  TopLogits* top) {
    const Model& m = on.m;
    const ModelShard& sh = m.shard;
    const backend::Ctx& ctx = on.ctx;
    const int64_t n = batch.n_tok(), n_seq = batch.n_seq(), d = m.local.hidden_size;
    const int64_t V = m.local.vocab_size;
    if (ctx.device == Device::cpu)
        reserve_huge_page_heap();  // the activations' heap in 2 MiB pages (core/allocator.h)
    ForwardStats scratch_stats;    // where timings go when the caller asked for none
    ForwardStats& stats = options.stats ? *options.stats : scratch_stats;
    const bool timed = options.stats != nullptr;
    auto now = [&] {
        if (timed)
            ops::synchronize(ctx);
        return wall_seconds();
    };
    if (top != nullptr)
        top->tokens.clear(), top->logits.clear(), top->log_sum.clear();
    backend::Scratch s(ctx);
    Tensor h = s(DType::f32, {n, d});  // [n, d] the residual stream
    if (n == 0) {  // the ep group's collectives: the loop runs the MoE layers alone
        run_step_layers(on, batch, step, options, h, stats, false);
        logits = sh.last_stage() ? Buffer(DType::f32, {0, V}) : Buffer();
        if (!sh.last_stage() && options.stage_out != nullptr)
            *options.stage_out = Buffer(DType::f32, {0, d});
        return;
    }
    if (sh.first_stage()) {
        const double t0 = now();
        embed_input(on, tokens, options.media, h);
        stats.head_seconds += now() - t0;
    } else {
        ScopedTimer timer(stats.pipeline_seconds);
        recv_on(ctx, h, m.comms->pp_prev, m.comms->pp, 0);
    }
    run_step_layers(on, batch, step, options, h, stats, timed);
    for (int64_t q = 0; q < n_seq; ++q)
        states[q]->n_tokens += batch.length(q);
    if (!sh.last_stage()) {
        logits = Buffer();
        Buffer out(DType::f32, {n, d}, uninit);
        ops::download(ctx, h, out.view());
        if (options.stage_out != nullptr)
            *options.stage_out = std::move(out);
        else
            send_to_next_stage(m, out).wait();
        return;
    }

    // final norm and head, on every row or only the last row of each sequence
    const double t0 = now();
    Tensor rows = h;
    if (options.logits == Logits::last) {
        std::vector<int64_t> last(static_cast<size_t>(n_seq));  // [n_seq] each one's last row
        for (int64_t q = 0; q < n_seq; ++q)
            last[q] = batch.offsets[q + 1] - 1;
        rows = s(DType::f32, {n_seq, d});
        ops::gather_rows(ctx, h, on_device(ctx, s, last, DType::i64), rows);
    }
    const int64_t r = rows.dim(0);
    const bool in_place = ctx.device == Device::cpu && top == nullptr;  // the head writes logits
    logits = in_place ? Buffer(DType::f32, {r, V}) : Buffer();
    Tensor out = in_place ? logits.view() : s(DType::f32, {r, V});  // [r, V]
    head_logits(on, rows, out);
    if (top != nullptr) {
        download_top(ctx, s, out, *top);
    } else if (!in_place) {
        logits = Buffer(DType::f32, {r, V}, uninit);
        ops::download(ctx, out, logits.view());
    }
    stats.head_seconds += now() - t0;
}

}  // namespace detail

void forward(const ModelOn& on,
             const std::vector<int64_t>& tokens,
             const SeqBatch& batch,
             const std::vector<SequenceState*>& states,
             Buffer& logits,
             const ForwardOptions& options,
             TopLogits* top) {
    HYMOE_CHECK(on.ctx.device == Device::cpu,
                "forward: the host's sequence states on a ",
                to_string(on.ctx.device),
                " context (a device model runs forward_step with its own)");
    detail::check_forward(
        on.m.local, on.m.shard.first_stage(), tokens, batch, states, options, top);
    detail::HostStep step(on.m, batch, states);
    detail::forward_step(on, tokens, batch, step, states, logits, options, top);
}

void forward(const Model& m,
             const std::vector<int64_t>& tokens,
             const SeqBatch& batch,
             const std::vector<SequenceState*>& states,
             Buffer& logits,
             const ForwardOptions& options) {
    const ModelViews views = host_views(m);
    forward(ModelOn{m, m.ctx, views}, tokens, batch, states, logits, options);
}

}  // namespace hymoe::model
