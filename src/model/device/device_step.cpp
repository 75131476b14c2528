// A step's packed batch on the model's device (DeviceModelOn::make_step, device_model_impl.h): the
// sequences checked to be this model's, each sequence's KDA block made at its first step, and the
// step's offsets, positions, KDA state pointers and slots, and block tables (for the host KV tier,
// remapped to its slots) uploaded, one small copy each; and the step as the one forward's
// StepStates (TableStep: device_runtime.h).
#include <algorithm>

#include "device_model_impl.h"
#include "hymoe/model/step_tables.h"

namespace hymoe::model::dev {

void DeviceModelOn::check_sequences(const SeqBatch& batch,
                                    const std::vector<SequenceState*>& states) const {
    for (int64_t s = 0; s < batch.n_seq(); ++s) {
        HYMOE_CHECK(batch.length(s) >= 1, "device forward: sequence ", s, " has no rows");
        HYMOE_CHECK(states[s]->device && states[s]->device->owner == this,
                    "device forward: sequence ",
                    s,
                    " was not made by this model's new_sequence()");
    }
}

float* DeviceModelOn::kda_state_of(DeviceSequence& ds) {
    if (ds.state != nullptr)
        return ds.state;
    ds.block = backend::Held(ctx(), DType::f32, {sequence_floats()});  // zeroed
    ds.state = static_cast<float*>(ds.block.view().data);
    if (kda_slots_) {  // S at the next slot boundary from the arena's base
        const auto slot_bytes = static_cast<size_t>(s_floats_) * sizeof(float);
        char* const base = owned_->base();
        const auto offset = static_cast<size_t>(reinterpret_cast<char*>(ds.state) - base);
        ds.state =
            reinterpret_cast<float*>(base + (offset + slot_bytes - 1) / slot_bytes * slot_bytes);
    }
    return ds.state;
}

StepBatch DeviceModelOn::make_step(backend::Scratch& s,
                                   const SeqBatch& batch,
                                   const std::vector<SequenceState*>& states) {
    StepBatch step;
    step.batch = &batch;
    step.n_tok = batch.n_tok();
    step.n_seq = batch.n_seq();
    const RowTables rows = row_tables(batch);
    step.offsets = upload_values(ctx(), s, step.staged, batch.offsets, DType::i64);
    step.row_seq = upload_values(ctx(), s, step.staged, rows.row_seq, DType::i32);
    if (n_adapters_ > 0) {  // each adapter's rows, once for every adapted projection
        step.lora.n_adapters = n_adapters_;
        step.lora.rows =
            upload_lora_rows(ctx(), s, step.staged, adapter_rows(batch, n_adapters_), 1)[0];
        if (!step.lora.rows.empty())
            step.lora.row_adapter = lora_row_adapters(batch);
    }
    step.positions = upload_values(ctx(), s, step.staged, rows.positions, DType::i64);
    step.visible = upload_values(ctx(), s, step.staged, rows.visible, DType::i32);

    // KDA: each sequence's state block (a new one zeroed), S and tail pointers and S slots per
    // (layer, sequence)
    step.fused = o_.fused;
    step.n_kda = n_kda_;
    if (n_kda_ > 0) {
        const auto slot_bytes = static_cast<int64_t>(s_floats_ * sizeof(float));
        char* const base = owned_->base();
        const auto cells = static_cast<size_t>(n_kda_ * step.n_seq);
        std::vector<float*> ptrs(4 * cells);  // [4, n_kda, n_seq] S, then q, k, v tails
        std::vector<int32_t> slots(cells);    // [n_kda, n_seq]
        for (int64_t q = 0; q < step.n_seq; ++q) {
            DeviceSequence& ds = *states[q]->device;
            kda_state_of(ds);
            const int64_t slot0 =
                kda_slots_ ? (reinterpret_cast<char*>(ds.state) - base) / slot_bytes : 0;
            for (int64_t j = 0; j < n_kda_; ++j) {
                const auto c = static_cast<size_t>(j * step.n_seq + q);
                ptrs[c] = ds.state + j * s_floats_;
                for (int64_t p = 0; p < 3; ++p)  // the layer's tails: planes q, k, v
                    ptrs[(p + 1) * cells + c] =
                        ds.state + n_kda_ * s_floats_ + j * tail_floats_ + p * tail_floats_ / 3;
                slots[c] = static_cast<int32_t>(slot0 + j);
            }
        }
        static_assert(sizeof(float*) == sizeof(int64_t));  // the pointers travel as i64
        step.kda_states = upload_values(ctx(), s, step.staged, ptrs, DType::i64);
        if (kda_slots_) {
            step.kda_pool = reinterpret_cast<float*>(base);
            step.kda_slots = upload_values(ctx(), s, step.staged, slots, DType::i32);
        }
    }
    if (first_attention_ < 0)
        return step;

    // the paged cache: one pool for every sequence, its store ours, block tables covering the step
    KvPool* pool = states.empty() ? nullptr : states[0]->attn[first_attention_].pool;
    HYMOE_CHECK(pool != nullptr || states.empty(),
                "device forward: the sequences are not paged into a KvPool (attach_kv_pool)");
    if (pool == nullptr)
        return step;
    auto* store = dynamic_cast<PagedKvStore*>(&pool->store());
    auto* host_kv = dynamic_cast<KvTier*>(&pool->store());
    HYMOE_CHECK(store ? store->on(ctx()) : host_kv != nullptr && host_kv->on(ctx()),
                "device forward: the KvPool's pages are not this model's (DeviceModel::kv_store "
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
    std::vector<const std::vector<int32_t>*> pages;  // [n_seq] their block tables
    for (const SequenceState* st : states) {
        HYMOE_CHECK(st->attn[first_attention_].pool == pool,
                    "device forward: the sequences of one step page into different pools");
        pages.push_back(&st->pages);
    }
    BlockTables tables = block_tables(batch, pages, step.page_tokens);
    step.max_pages = tables.max_pages;
    if (host_kv != nullptr)  // the tables in slot indices
        host_kv->stage_step(batch, tables.table, step);
    const OneRows one = one_rows(batch, tables);
    step.block_table = upload_values(ctx(), s, step.staged, tables.table, DType::i32);
    step.n_one = static_cast<int64_t>(one.rows.size());
    step.one_rows = upload_values(ctx(), s, step.staged, one.rows, DType::i64);
    step.one_table = upload_values(ctx(), s, step.staged, one.table, DType::i32);
    step.one_keys = upload_values(ctx(), s, step.staged, one.keys, DType::i32);
    step.one_max_keys = one.max_keys;
    return step;
}

KdaBatchViews kda_batch(const StepBatch& step, int j) {
    KdaBatchViews b;
    b.batch = step.batch;
    b.lora_rows = &step.lora.rows;
    ops::KdaSeqTable& t = b.table;
    t.n_tok = step.n_tok;
    t.n_seq = step.n_seq;
    for (int64_t q = 0; q < step.n_seq; ++q)
        t.max_len = std::max(t.max_len, step.batch->length(q));
    t.offsets = step.offsets.ptr<int64_t>();
    t.row_seq = step.row_seq.ptr<int32_t>();
    float* const* ptrs = step.kda_states.ptr<float*>();  // [4, n_kda, n_seq]
    t.state = ptrs + j * step.n_seq;
    for (int64_t p = 0; p < 3; ++p)
        t.tail[p] = ptrs + ((p + 1) * step.n_kda + j) * step.n_seq;
    if (step.fused && step.kda_pool != nullptr) {
        t.pool = step.kda_pool;
        t.slot = step.kda_slots.ptr<int32_t>() + j * step.n_seq;
    }
    return b;
}

}  // namespace hymoe::model::dev

namespace hymoe::model::dev {

namespace {

// The most keys a row of the step sees: the longest sequence's length after the step.
int64_t max_visible(const StepBatch& step) {
    const SeqBatch& batch = *step.batch;
    int64_t most = 0;
    for (int64_t q = 0; q < step.n_seq; ++q)
        most = std::max(most, batch.pos0[q] + batch.length(q));
    return most;
}

}  // namespace

TableStep::TableStep(const ModelConfig& cfg,
                     const ModelShard& shard,
                     const std::vector<int>& kda_index,
                     const StepBatch& step,
                     DType cd,
                     int n_sm,
                     const std::vector<SequenceState*>* states)
    : cfg_(cfg),
      shard_(shard),
      kda_index_(kda_index),
      step_(step),
      cd_(cd),
      n_sm_(n_sm),
      states_(states) {
    // a model with adapters in a step none of whose rows uses one: every row the base model's
    // (−1), not adapter 0 (moe_forward_parallel's choice without rows)
    const bool lora = !step.lora.rows.empty();
    if (lora)
        rows_ = single_rows(step.lora.row_adapter);
    else if (step.lora.n_adapters > 0)
        rows_ = single_rows(std::vector<int>(static_cast<size_t>(step.n_tok), -1));
    has_rows_ = lora || step.lora.n_adapters > 0;
}

detail::StepStates::Attention TableStep::attention(int i) {
    if (step_.host_kv != nullptr)
        step_.host_kv->await_layer(i);
    const bool dsa = cfg_.layers[i].mixer == Mixer::dsa;
    dev_ = DeviceAttnRows{};
    dev_.pages.dtype = DType::f32;
    dev_.pages.r_kv = cfg_.mla.kv_lora_rank;
    dev_.pages.d_r = cfg_.mla.qk_rope_head_dim;
    dev_.pages.d_i = dsa ? cfg_.indexer.head_dim : 0;
    dev_.pages.page_tokens = step_.page_tokens;
    dev_.pages.row_stride = step_.row_width[static_cast<size_t>(i)];
    dev_.pages.base = step_.pages + step_.layer_offset[static_cast<size_t>(i)];
    dev_.pages.page_stride = step_.page_stride;
    dev_.pages.block_table = step_.block_table.ptr<int32_t>();
    dev_.pages.max_pages = step_.max_pages;
    dev_.pos = step_.positions;
    dev_.row_seq = step_.row_seq;
    ops::MlaDeviceRows& r = dev_.rows;
    r.row_seq = step_.row_seq.ptr<int32_t>();
    r.visible = step_.visible.ptr<int32_t>();
    r.n_one = step_.n_one;
    r.one_rows = step_.n_one > 0 ? step_.one_rows.ptr<int64_t>() : nullptr;
    r.one_table = step_.n_one > 0 ? step_.one_table.ptr<int32_t>() : nullptr;
    r.one_keys = step_.n_one > 0 ? step_.one_keys.ptr<int32_t>() : nullptr;
    r.one_max_keys = step_.one_max_keys;
    fused_ = dsa && step_.fused && cd_ == DType::bf16 && n_sm_ > 0
                 ? dsa_fused_plan(cfg_, step_.n_tok, max_visible(step_), step_.n_seq == 1, n_sm_)
                 : DsaFusedPlan{};
    if (fused_.supported) {
        r.indexer_plan = &fused_.indexer;
        r.sparse_plan = &fused_.attention;
        r.fused_top_k = fused_.top_k;
    }
    return Attention{{}, &dev_};
}

void TableStep::leave_attention(int i) {
    if (step_.host_kv != nullptr)
        step_.host_kv->release_layer(i);
}

void TableStep::end_step() {
    if (step_.host_kv != nullptr)
        step_.host_kv->finish_step();
    if (states_ != nullptr)
        advance_caches(cfg_, shard_, *step_.batch, *states_);
}

void advance_caches(const ModelConfig& cfg,
                    const ModelShard& shard,
                    const SeqBatch& batch,
                    const std::vector<SequenceState*>& states) {
    for (int64_t q = 0; q < batch.n_seq(); ++q)
        for (int i = shard.first_layer; i < shard.end_layer; ++i)
            if (cfg.layers[i].mixer != Mixer::kda)
                states[q]->attn[i].n += batch.length(q);
}

}  // namespace hymoe::model::dev
