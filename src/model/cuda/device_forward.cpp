// The GPU model's forward (CudaModel::forward, cuda_model_impl.h): the embedding, the layers
// (h += mixer(RMSNorm₁ h); h += ffn(RMSNorm₂ h), blocks in device_*.cpp; with the host KV tier,
// each attention layer's pages awaited and released), the final norm and the head, and one copy
// of the logits to the host (or of each row's top tokens: model::TopLogits). The layers run
// through the model's one layer loop (layer.h run_layers) on this model's blocks. A pure decode
// step that qualifies (decode_graph_plan.h) replays a CUDA graph of the same embedding, layers
// and head instead (device_decode_graphs.h).
#include <algorithm>

#include "../layer.h"
#include "cuda_model_impl.h"
#include "hymoe/backend/cuda_ops.h"
#include "hymoe/core/timer.h"
#include "hymoe/parallel/comm.h"
#include "hymoe/parallel/comms.h"

namespace hymoe::model::gpu {

void CudaModel::embed(Scratch& s, const Tensor& ids, Tensor& h) {
    const DType cd = o_.dtype;
    Tensor e = cd == DType::f32 ? h : s(cd, h.shape);  // [n, d] the table's rows
    cu::embed_rows(g_->stream, embed_, ids, 0, e);
    if (cd != DType::f32)
        cu::cast(g_->stream, e, h);
}

void CudaModel::layers(const StepBatch& step, Tensor& h, ForwardStats& stats, bool timed) {
    // This model's blocks on its device weights and the step's rows and states, for the
    // model's one layer loop (layer.h).
    class Blocks final : public detail::LayerBlocks {
    public:
        Blocks(CudaModel& m, const StepBatch& step, ForwardStats& stats, bool timed)
            : m_(m), step_(step), stats_(stats), timed_(timed), ctx_(ctx_of(*m.g_)) {}
        const backend::Ctx& ctx() const override { return ctx_; }
        const Tensor& attn_norm(int i) const override { return m_.layers_[i].attn_norm; }
        const Tensor& ffn_norm(int i) const override { return m_.layers_[i].ffn_norm; }
        double clock() const override {
            if (timed_)
                m_.g_->stream.synchronize();
            return wall_seconds();
        }
        void mixer(int i, const Tensor& xn, Tensor& y) override {
            const LayerViews& w = m_.layers_[i];
            if (m_.cfg_.layers[i].mixer == Mixer::kda) {
                kda_forward(ctx_, m_.cfg_, w.kda, xn, kda_batch(step_, m_.kda_index_[i]), y);
                tp_sum(y);
                return;
            }
            const double t0 = clock();
            if (step_.host_kv != nullptr)
                step_.host_kv->await_layer(i);
            double indexer = 0;
            attention_block(*m_.g_,
                            m_.cfg_,
                            m_.cfg_.layers[i],
                            w.mla,
                            xn,
                            step_,
                            i,
                            m_.o_.dtype,
                            m_.shard_.tp > 1 ? &m_.comms_->tp : nullptr,
                            y,
                            timed_ ? &indexer : nullptr);
            if (step_.host_kv != nullptr)
                step_.host_kv->release_layer(i);
            stats_.attn.indexer_seconds += indexer;
            stats_.attn.attention_seconds += clock() - t0 - indexer;
            tp_sum(y);
        }
        void ffn(int i, const Tensor& xn, Tensor& y, MoeCommStats* stats) override {
            const LayerSpec& spec = m_.cfg_.layers[i];
            const LayerViews& w = m_.layers_[i];
            const DType cd = m_.o_.dtype;
            if (spec.ffn == Ffn::dense) {
                Scratch s(m_.g_->arena);
                dense_ffn_forward(ctx_,
                                  w.dense,
                                  ExpertAct::swiglu,
                                  in_dtype(*m_.g_, s, xn, cd),
                                  y,
                                  nullptr,
                                  &step_.lora.rows);
                tp_sum(y);
            } else {  // fused where moe_runs_fused allows; the expert load only when timed
                MoeParallel par = m_.moe_par_;
                par.fused = m_.o_.fused;
                par.fused_load = timed_;
                const bool lora = !step_.lora.rows.empty();
                // a model with adapters in a step none of whose rows uses one: every row the
                // base model's (−1), not adapter 0 (moe_forward_parallel's choice without rows)
                const bool base_rows = !lora && step_.lora.n_adapters > 0;
                const int64_t n = xn.dim(0);
                const SeqBatch rows =
                    lora        ? single_rows(step_.lora.row_adapter)
                    : base_rows ? single_rows(std::vector<int>(static_cast<size_t>(n), -1))
                                : SeqBatch();
                moe_forward_parallel(
                    ctx_,
                    m_.cfg_,
                    spec,
                    moe_views_of(m_.moe_[i], cd, m_.cfg_.moe.n_routed_experts, par.ep),
                    xn,
                    y,
                    par,
                    stats,
                    lora || base_rows ? &rows : nullptr,
                    nullptr,
                    lora ? &step_.lora.rows : nullptr);
            }
        }

    private:
        // x ← Σ over tp of x: the partial outputs of this rank's heads and widths.
        void tp_sum(Tensor& x) const {
            if (m_.shard_.tp > 1) {  // comm:: runs outside the stream: wait for x first
                m_.g_->stream.synchronize();
                comm::all_reduce(x, m_.comms_->tp);
            }
        }

        CudaModel& m_;
        const StepBatch& step_;
        ForwardStats& stats_;
        bool timed_;
        backend::Ctx ctx_;
    };
    Blocks blocks(*this, step, stats, timed);
    const bool moe_collective = moe_par_.tp != nullptr || moe_par_.ep != nullptr;
    detail::run_layers(
        cfg_, shard_.first_layer, shard_.end_layer, moe_collective, blocks, h, stats, {});
    if (step.host_kv != nullptr)
        step.host_kv->finish_step();
}

void CudaModel::head(Scratch& s, const Tensor& rows, Tensor& out) {
    Tensor normed = s(DType::f32, rows.shape);
    cu::rms_norm(g_->stream, rows, final_norm_, static_cast<float>(cfg_.rms_norm_eps), normed);
    g_->blas.linear(in_dtype(*g_, s, normed, o_.dtype), head_, out);
}

namespace {

// Each sequence advances by its rows (its caches: the stage's attention layers').
void advance(const ModelConfig& cfg,
             const ModelShard& sh,
             const SeqBatch& batch,
             const std::vector<SequenceState*>& states) {
    for (int64_t q = 0; q < batch.n_seq(); ++q) {
        states[q]->n_tokens += batch.length(q);
        for (int i = sh.first_layer; i < sh.end_layer; ++i)
            if (cfg.layers[i].mixer != Mixer::kda)
                states[q]->attn[i].n += batch.length(q);
    }
}

}  // namespace

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
    KvGeometry kv;
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
    advance(cfg_, shard_, batch, states);
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
    const int64_t V = cfg_.vocab_size;
    ForwardStats scratch_stats;  // where timings go when the caller asked for none
    ForwardStats& stats = options.stats ? *options.stats : scratch_stats;
    const bool last_stage = shard_.last_stage();
    if (top != nullptr && (n == 0 || !last_stage))
        top->tokens.clear(), top->logits.clear(), top->log_sum.clear();
    if (n == 0) {  // the ep group's collectives: the loop runs the MoE layers alone
        Scratch s(g_->arena);
        Tensor none = s(DType::f32, {0, d});  // [0, d]
        layers(StepBatch{}, none, stats, false);
        logits = last_stage ? Buffer(DType::f32, {0, V}) : Buffer();
        if (!last_stage && options.stage_out != nullptr)
            *options.stage_out = Buffer(DType::f32, {0, d});
        return;
    }
    const bool timed = options.stats != nullptr;
    auto now = [&] {
        if (timed)
            g_->stream.synchronize();
        return wall_seconds();
    };
    const cu::Stream& st = g_->stream;
    Scratch s(g_->arena);
    double t0 = now();
    const StepBatch step = make_step(s, batch, states);
    Tensor h = s(DType::f32, {n, d});  // [n, d] the residual stream
    if (shard_.first_stage()) {
        embed(s, upload_values(*g_, s, tokens, DType::i64), h);
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
            cu::scatter_rows(st, embeds, upload_values(*g_, s, media.rows, DType::i64), h);
        }
    } else {  // the previous stage's residual stream, through the host
        Buffer in(DType::f32, {n, d}, uninit);
        {
            ScopedTimer wait(stats.pipeline_seconds);
            comm::recv(in.view(), comms_->pp_prev, comms_->pp, 0);
        }
        cu::upload(in.view(), h, st);
        st.synchronize();  // `in` goes when this block ends
    }
    stats.head_seconds += now() - t0;

    layers(step, h, stats, timed);
    advance(cfg_, shard_, batch, states);
    if (!last_stage) {  // the residual stream to the next stage, through the host
        Buffer out(DType::f32, {n, d}, uninit);
        cu::download(h, out.view(), st);
        st.synchronize();
        logits = Buffer();
        if (options.stage_out != nullptr)
            *options.stage_out = std::move(out);
        else
            comm::send(out.view(), comms_->pp_next, comms_->pp, 0);
        return;
    }

    // final norm and head, on every row or only the last row of each sequence
    t0 = now();
    Tensor rows = h;
    if (options.logits == Logits::last) {
        std::vector<int64_t> last(static_cast<size_t>(n_seq));
        for (int64_t q = 0; q < n_seq; ++q)
            last[q] = batch.offsets[q + 1] - 1;
        rows = s(DType::f32, {n_seq, d});
        cu::gather_rows(st, h, upload_values(*g_, s, last, DType::i64), rows);
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

}  // namespace hymoe::model::gpu
