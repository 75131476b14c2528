// The decode graphs (device_decode_graphs.h) and the fixed-address scratch their steps use
// (Workspace, WorkspaceScope).
#include "device_decode_graphs.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <utility>

#include "hymoe/backend/cuda_model_ops.h"
#include "hymoe/core/error.h"

namespace hymoe::model::dev {

// ---- workspace ----------------------------------------------------------------------------------

Tensor Workspace::tensor(DType dtype, Shape shape) {
    Tensor t;
    t.dtype = dtype;
    t.device = Device::cuda;
    t.shape = std::move(shape);
    t.data = base + stack.push(t.bytes(), 256);
    return t;
}

void Workspace::release(void* p) noexcept {
    try {
        stack.pop(static_cast<size_t>(static_cast<char*>(p) - base));
    } catch (const Error& e) {
        std::fprintf(stderr, "hymoe: decode graph workspace: %s\n", e.what());
        std::abort();
    }
}

// ---- the runner ---------------------------------------------------------------------------------

DecodeGraphRunner::DecodeGraphRunner(const backend::Ctx& ctx,
                                     int max_batch,
                                     int64_t vocab,
                                     size_t workspace_bytes,
                                     const KdaBlockShape& kda,
                                     float* kda_pool,
                                     Step step)
    : stream_(*ctx.stream),
      arena_(*ctx.arena),
      buckets_(max_batch),
      vocab_(vocab),
      kda_(kda),
      kda_pool_(kda_pool),
      step_(std::move(step)),
      workspace_block_(arena_, workspace_bytes) {
    workspace_.arena = &arena_;
    workspace_.base = workspace_block_.data();
    workspace_.stack = cu::StackAllocator(workspace_bytes);
    logits_block_ = ArenaBlock(arena_, static_cast<size_t>(max_batch * vocab) * sizeof(float));
    logits_ = Tensor{logits_block_.data(), DType::f32, Device::cuda, {max_batch, vocab}};
    if (kda_.n_kda > 0) {  // the padding's KDA block, its S at a slot like a sequence's
        const auto slot_bytes = static_cast<int64_t>(kda_.s_floats * sizeof(float));
        const int64_t used = kda_.n_kda * (kda_.s_floats + kda_.tail_floats);
        pad_state_ = ArenaBlock(arena_, static_cast<size_t>(used * 4 + slot_bytes));
        const int64_t offset = pad_state_.data() - arena_.base();
        const int64_t start =
            kda_pool_ ? (offset + slot_bytes - 1) / slot_bytes * slot_bytes : offset;
        pad_.kda_state = reinterpret_cast<uint64_t>(arena_.base() + start);
        pad_.kda_slot = static_cast<int32_t>(kda_pool_ ? start / slot_bytes : 0);
    }
}

cu::DecodeGraphs& DecodeGraphRunner::graphs(int64_t key_bucket) {
    std::unique_ptr<cu::DecodeGraphs>& gr = graphs_[key_bucket];
    if (!gr)
        gr = std::make_unique<cu::DecodeGraphs>(buckets_,
                                                [this, key_bucket](const cu::Stream&, int bucket) {
                                                    queue(graph_.at({bucket, key_bucket}));
                                                });
    return *gr;
}

DecodeGraphRunner::Graph& DecodeGraphRunner::graph(int bucket, int64_t key_bucket) {
    const auto found = graph_.find({bucket, key_bucket});
    if (found != graph_.end())
        return found->second;
    Graph gr;
    const int64_t width = kv_ ? table_width(key_bucket, kv_->page_tokens) : 1;
    gr.layout = decode_meta_layout(bucket, width, kda_.n_kda);
    gr.key_bucket = key_bucket;
    gr.meta = ArenaBlock(arena_, gr.layout.bytes);
    gr.host = std::make_unique<cu::PinnedBuffer>(gr.layout.bytes);
    gr.padded.offsets.resize(static_cast<size_t>(bucket) + 1);
    for (int r = 0; r <= bucket; ++r)
        gr.padded.offsets[static_cast<size_t>(r)] = r;
    gr.padded.pos0.assign(static_cast<size_t>(bucket), std::max<int64_t>(key_bucket - 1, 0));
    return graph_.emplace(std::make_pair(bucket, key_bucket), std::move(gr)).first->second;
}

// Places the padding's KV page next to a new store, at a whole page index from its base, and
// re-captures (same geometry) or drops (another) the graphs that address the old one.
void DecodeGraphRunner::follow_store(const KvGeometry& kv) {
    if (kv_ && kv_->pages == kv.pages && kv_->same_shape(kv))
        return;
    const bool refresh = kv_ && kv_->same_shape(kv);
    kv_ = std::make_unique<KvGeometry>(kv);
    const int64_t page_bytes = kv.page_floats * static_cast<int64_t>(sizeof(float));
    pad_page_ = ArenaBlock();
    pad_page_ = ArenaBlock(arena_, static_cast<size_t>(2 * page_bytes));
    const int64_t delta = pad_page_.data() - reinterpret_cast<char*>(kv.pages);
    const int64_t page =
        delta >= 0 ? (delta + page_bytes - 1) / page_bytes : -(-delta / page_bytes);
    HYMOE_CHECK(
        page >= std::numeric_limits<int32_t>::min() && page <= std::numeric_limits<int32_t>::max(),
        "decode graphs: the padding's KV page is ",
        page,
        " pages from the store's base");
    pad_.page = static_cast<int32_t>(page);
    if (refresh) {
        for (auto& [keys, gr] : graphs_) {
            const int before = gr->updated() + gr->reinstantiated();
            gr->refresh(stream_);
            counters_.refreshes += gr->updated() + gr->reinstantiated() - before;
        }
        return;
    }
    if (!graph_.empty())
        ++counters_.resets;
    graphs_.clear();
    graph_.clear();
}

void DecodeGraphRunner::upload(Graph& gr, const std::vector<DecodeRow>& rows) {
    pack_decode_meta(gr.layout, kda_, kv_ ? kv_->page_tokens : 1, rows, pad_, gr.host->data());
    cu::copy_to_device(gr.meta.data(), gr.host->data(), gr.layout.bytes, stream_);
}

StepBatch DecodeGraphRunner::step_of(const Graph& gr) const {
    const DecodeMetaLayout& L = gr.layout;
    const int64_t B = L.rows;
    auto at = [&](size_t offset, DType dtype, Shape shape) {
        return Tensor{gr.meta.data() + offset, dtype, Device::cuda, std::move(shape)};
    };
    StepBatch s;
    s.batch = &gr.padded;
    s.n_tok = s.n_seq = B;
    s.offsets = at(L.offsets, DType::i64, {B + 1});
    s.row_seq = at(L.row_seq, DType::i32, {B});
    s.positions = at(L.positions, DType::i64, {B});
    s.n_kda = kda_.n_kda;
    s.kda_states = at(L.kda_states, DType::i64, {4 * L.n_kda * B});
    s.kda_pool = kda_pool_;
    if (kda_pool_)
        s.kda_slots = at(L.kda_slots, DType::i32, {L.n_kda, B});
    s.fused = true;
    if (!kv_)
        return s;
    s.pages = kv_->pages;
    s.page_stride = kv_->page_floats;
    s.page_tokens = kv_->page_tokens;
    s.layer_offset = kv_->layer_offset;
    s.row_width = kv_->row_width;
    s.block_table = at(L.block_table, DType::i32, {B, L.max_pages});
    s.max_pages = static_cast<int>(L.max_pages);
    s.n_one = B;
    s.one_rows = at(L.one_rows, DType::i64, {B});
    s.one_table = s.block_table;
    s.one_keys = at(L.one_keys, DType::i32, {B});
    s.visible = s.one_keys;  // a decode row sees its keys, its own included
    s.one_max_keys = gr.key_bucket;
    return s;
}

void DecodeGraphRunner::queue(const Graph& gr) {
    WorkspaceScope scope(workspace_);
    if (kda_.n_kda > 0)  // the padding's state starts every step at zero, so it stays finite
        cu::zero(
            reinterpret_cast<void*>(pad_.kda_state),
            static_cast<size_t>(kda_.n_kda * (kda_.s_floats + kda_.tail_floats)) * sizeof(float),
            stream_);
    const StepBatch s = step_of(gr);
    const int64_t B = gr.layout.rows;
    const Tensor ids{gr.meta.data() + gr.layout.tokens, DType::i64, Device::cuda, {B}};
    Tensor logits = logits_.rows(0, B);
    step_(s, ids, logits);
    HYMOE_CHECK(workspace_.stack.depth() == 0,
                "decode graphs: the step left ",
                workspace_.stack.depth(),
                " scratch blocks held");
}

Tensor DecodeGraphRunner::run(const std::vector<DecodeRow>& rows, const KvGeometry* kv) {
    const auto n = static_cast<int>(rows.size());
    int64_t keys = 0;  // the key bucket (0: no attention layer)
    if (kv) {
        follow_store(*kv);
        int64_t max_keys = 1;
        for (const DecodeRow& r : rows)
            max_keys = std::max(max_keys, r.position + 1);
        keys = key_bucket(max_keys);
    }
    const int bucket = buckets_.bucket_for(n);
    const bool fresh = graph_.count({bucket, keys}) == 0;
    Graph& gr = graph(bucket, keys);
    cu::DecodeGraphs& dg = graphs(keys);
    if (fresh) {  // one eager step on padding alone: one-time setup before the capture
        upload(gr, {});
        queue(gr);
        stream_.synchronize();  // the staging is free again
        ++counters_.warmups;
    }
    upload(gr, rows);
    const int captured = dg.captured();
    dg.run(stream_, n);
    counters_.captures += dg.captured() - captured;
    ++counters_.graph_steps;
    return logits_.rows(0, n);
}

std::unique_ptr<DecodeGraphs> make_decode_graphs(const backend::Ctx& ctx,
                                                 int max_batch,
                                                 int64_t vocab,
                                                 size_t workspace_bytes,
                                                 const KdaBlockShape& kda,
                                                 float* kda_pool,
                                                 DecodeGraphs::Step step) {
    return std::make_unique<DecodeGraphRunner>(
        ctx, max_batch, vocab, workspace_bytes, kda, kda_pool, std::move(step));
}

}  // namespace hymoe::model::dev
