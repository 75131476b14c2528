// The GPU model's forward (CudaModel::forward, cuda_model_impl.h): the step's packed batch on the
// device (device_step.cpp), then the model's one forward (src/model/forward.cpp forward_step: the
// embedding, the layers through the one layer loop, the head and the copy of the logits or of
// each row's top tokens to the host) over this model's weights and the step's states (CudaStep).
// A pure decode step that qualifies (decode_graph_plan.h) replays a CUDA graph of the same
// embedding, layers and head instead (device_decode_graphs.h).
#include <algorithm>

#include "cuda_model_impl.h"
#include "hymoe/backend/cuda_ops.h"
#include "hymoe/backend/ops_rows.h"

namespace hymoe::model::gpu {

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
        backend::Scratch s(ctx_);
        detail::download_top(ctx_, s, out, *top);
        logits = Buffer();
    } else {
        logits = Buffer(DType::f32, out.shape, uninit);
        ops::download(ctx_, out, logits.view());
    }
    for (int64_t q = 0; q < batch.n_seq(); ++q)
        states[q]->n_tokens += batch.length(q);
    advance_caches(cfg_, shard_, batch, states);
    return true;
}

void CudaModel::forward(const std::vector<int64_t>& tokens,
                        const SeqBatch& batch,
                        const std::vector<SequenceState*>& states,
                        Buffer& logits,
                        const ForwardOptions& options,
                        TopLogits* top) {
    detail::check_forward(cfg_, shard_.first_stage(), tokens, batch, states, options, top);
    check_sequences(batch, states);
    if (graphs_ && forward_graph(tokens, batch, states, logits, options, top))
        return;
    Scratch s(g_->arena);
    StepBatch step;
    step.batch = &batch;
    if (batch.n_tok() > 0)
        step = make_step(s, batch, states);
    CudaStep on_device(cfg_, shard_, kda_index_, step, o_.dtype, &states);
    detail::forward_step(on(), tokens, batch, on_device, states, logits, options, top);
}

}  // namespace hymoe::model::gpu
