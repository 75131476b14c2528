// The forward of the model on a device (DeviceModelOn::forward, device_model_impl.h): the step's
// packed batch on the device (device_step.cpp), then the model's one forward (src/model/forward.cpp
// forward_step: the embedding, the layers through the one layer loop, the head and the copy of the
// logits or of each row's top tokens to the host) over this model's weights and the step's states
// (TableStep). On a GPU, a pure decode step that qualifies (decode_graph_plan.h) replays a CUDA
// graph of the same embedding, layers and head instead (src/model/cuda/device_decode_graphs.h).
#include <algorithm>

#include "device_model_impl.h"
#include "hymoe/backend/ops_rows.h"

namespace hymoe::model::dev {

bool DeviceModelOn::forward_graph(const std::vector<int64_t>& tokens,
                                  const SeqBatch& batch,
                                  const std::vector<SequenceState*>& states,
                                  Buffer& logits,
                                  const ForwardOptions& options,
                                  TopLogits* top) {
    // the store of the sequences' pages: plainly resident (this model's PagedKvStore, not the host
    // tier) and one for all
    KvPool* pool = nullptr;
    const PagedKvStore* store = nullptr;
    bool resident = true;
    if (first_attention_ >= 0 && !states.empty()) {
        pool = states[0]->attn[first_attention_].pool;
        store = pool ? dynamic_cast<const PagedKvStore*>(&pool->store()) : nullptr;
        resident = store != nullptr && store->on(ctx());
        for (const SequenceState* st : states)
            resident = resident && st->attn[first_attention_].pool == pool;
    }
    if (decode_graph_refusal(cfg_, graph_model_, graphs_->buckets(), batch, options, resident) !=
        GraphRefusal::none)
        return false;
    char* const base = owned_->base();
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
            r.kda_slot =
                kda_slots_ ? static_cast<int32_t>((reinterpret_cast<char*>(S) - base) / slot_bytes)
                           : 0;
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
        backend::Scratch s(ctx());
        detail::download_top(ctx(), s, out, *top);
        logits = Buffer();
    } else {
        logits = Buffer(DType::f32, out.shape, uninit);
        ops::download(ctx(), out, logits.view());
    }
    for (int64_t q = 0; q < batch.n_seq(); ++q)
        states[q]->n_tokens += batch.length(q);
    advance_caches(cfg_, shard_, batch, states);
    return true;
}

void DeviceModelOn::forward(const std::vector<int64_t>& tokens,
                            const SeqBatch& batch,
                            const std::vector<SequenceState*>& states,
                            Buffer& logits,
                            const ForwardOptions& options,
                            TopLogits* top) {
    detail::check_forward(cfg_, shard_.first_stage(), tokens, batch, states, options, top);
    check_sequences(batch, states);
    if (graphs_ && forward_graph(tokens, batch, states, logits, options, top))
        return;
    backend::Scratch s(ctx());
    StepBatch step;
    step.batch = &batch;
    if (batch.n_tok() > 0)
        step = make_step(s, batch, states);
    TableStep on_device(cfg_, shard_, kda_index_, step, o_.dtype, n_sm_, &states);
    detail::forward_step(on(), tokens, batch, on_device, states, logits, options, top);
}

}  // namespace hymoe::model::dev
