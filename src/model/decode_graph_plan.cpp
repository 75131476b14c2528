// The decode graphs' host side (model/decode_graph_plan.h): the eligibility rules in the order
// they are checked, and the metadata block's layout and packing.
#include "hymoe/model/decode_graph_plan.h"

#include <cstring>

#include "hymoe/core/error.h"
#include "hymoe/model/fused_step.h"
#include "hymoe/model/lora_rows.h"
#include "hymoe/model/moe_parallel.h"

namespace hymoe::model {

int64_t key_bucket(int64_t max_keys) {
    int64_t b = kMinKeyBucket;
    while (b < max_keys)
        b *= 2;
    return b;
}

const char* to_string(GraphRefusal r) {
    switch (r) {
        case GraphRefusal::none:
            return "none";
        case GraphRefusal::off:
            return "graphs off";
        case GraphRefusal::ep:
            return "MoE dispatched over an ep group";
        case GraphRefusal::stats:
            return "timings asked for";
        case GraphRefusal::forms:
            return "a KDA or attention form asked for";
        case GraphRefusal::media:
            return "media rows";
        case GraphRefusal::lora:
            return "LoRA adapters in use";
        case GraphRefusal::not_decode:
            return "not a pure decode step";
        case GraphRefusal::too_many:
            return "more sequences than the largest bucket";
        case GraphRefusal::kda:
            return "KDA off the fused decode kernel";
        case GraphRefusal::moe:
            return "MoE routed on the host";
        case GraphRefusal::dsa:
            return "DSA off the fused kernels";
        case GraphRefusal::kv_store:
            return "KV pages not resident on the device";
        case GraphRefusal::keys:
            return "key bucket beyond the workspace";
    }
    return "?";
}

GraphRefusal decode_graph_refusal(const ModelConfig& cfg,
                                  const DecodeGraphModel& model,
                                  const backend::cuda::DecodeBuckets& buckets,
                                  const SeqBatch& batch,
                                  const ForwardOptions& options,
                                  bool kv_resident) {
    if (!model.graphs || !model.fused)
        return GraphRefusal::off;
    if (model.ep > 1)
        return GraphRefusal::ep;
    if (options.stats != nullptr)
        return GraphRefusal::stats;
    if (options.kda_mode != KdaMode::automatic || options.attn_mode != AttnMode::automatic)
        return GraphRefusal::forms;
    if (options.media != nullptr && !options.media->rows.empty())
        return GraphRefusal::media;
    if (!adapter_rows(batch, model.n_adapters).rows.empty())
        return GraphRefusal::lora;
    const int64_t n = batch.n_seq();
    if (n == 0 || batch.n_tok() != n)
        return GraphRefusal::not_decode;
    for (int64_t s = 0; s < n; ++s)
        if (batch.length(s) != 1)
            return GraphRefusal::not_decode;
    if (n > buckets.max())
        return GraphRefusal::too_many;
    const int bucket = buckets.bucket_for(static_cast<int>(n));
    int64_t max_keys = 1;
    for (int64_t s = 0; s < n; ++s)
        max_keys = std::max(max_keys, batch.pos0[s] + 1);
    const int64_t keys = key_bucket(max_keys);
    bool attention = false;
    for (const LayerSpec& spec : cfg.layers) {
        if (spec.mixer == Mixer::kda && (!model.kda_slots || cfg.kda.head_dim > 128))
            return GraphRefusal::kda;
        if (spec.ffn != Ffn::dense &&  // graphs: tp 1, ep 1 (above), no adapters (above)
            !moe_runs_fused(Device::cuda, cfg, spec, model.dtype, bucket, MoeParallel{}, false))
            return GraphRefusal::moe;
        if (spec.mixer == Mixer::dsa &&
            (model.dtype != DType::bf16 ||
             !dsa_fused_plan(cfg, bucket, keys, bucket == 1, model.n_sm).supported))
            return GraphRefusal::dsa;
        attention = attention || spec.mixer != Mixer::kda;
    }
    if (!attention)
        return GraphRefusal::none;
    if (!kv_resident)
        return GraphRefusal::kv_store;
    if (keys > model.max_key_bucket)
        return GraphRefusal::keys;
    return GraphRefusal::none;
}

DecodeMetaLayout decode_meta_layout(int64_t rows, int64_t max_pages, int64_t n_kda) {
    HYMOE_CHECK(rows >= 1 && max_pages >= 1 && n_kda >= 0,
                "decode graph metadata: ",
                rows,
                " rows, ",
                max_pages,
                " pages, ",
                n_kda,
                " KDA layers");
    DecodeMetaLayout L;
    L.rows = rows;
    L.max_pages = max_pages;
    L.n_kda = n_kda;
    auto take = [&](int64_t count, size_t elem) {
        const size_t at = L.bytes;
        L.bytes += (static_cast<size_t>(count) * elem + 15) / 16 * 16;
        return at;
    };
    L.tokens = take(rows, 8);
    L.positions = take(rows, 8);
    L.offsets = take(rows + 1, 8);
    L.one_rows = take(rows, 8);
    L.row_seq = take(rows, 4);
    L.one_keys = take(rows, 4);
    L.block_table = take(rows * max_pages, 4);
    L.kda_states = take(4 * n_kda * rows, 8);
    L.kda_slots = take(n_kda * rows, 4);
    return L;
}

void pack_decode_meta(const DecodeMetaLayout& L,
                      const KdaBlockShape& kda,
                      int page_tokens,
                      const std::vector<DecodeRow>& rows,
                      const DecodePadding& pad,
                      void* dst) {
    const auto n = static_cast<int64_t>(rows.size());
    HYMOE_CHECK(n <= L.rows && kda.n_kda == L.n_kda && page_tokens >= 1,
                "decode graph metadata: ",
                n,
                " rows for a graph of ",
                L.rows,
                ", ",
                kda.n_kda,
                " KDA layers for ",
                L.n_kda);
    char* base = static_cast<char*>(dst);
    std::memset(base, 0, L.bytes);
    auto* tokens = reinterpret_cast<int64_t*>(base + L.tokens);
    auto* positions = reinterpret_cast<int64_t*>(base + L.positions);
    auto* offsets = reinterpret_cast<int64_t*>(base + L.offsets);
    auto* one_rows = reinterpret_cast<int64_t*>(base + L.one_rows);
    auto* row_seq = reinterpret_cast<int32_t*>(base + L.row_seq);
    auto* one_keys = reinterpret_cast<int32_t*>(base + L.one_keys);
    auto* table = reinterpret_cast<int32_t*>(base + L.block_table);
    auto* states = reinterpret_cast<uint64_t*>(base + L.kda_states);
    auto* slots = reinterpret_cast<int32_t*>(base + L.kda_slots);
    const int64_t B = L.rows, mp = L.max_pages;
    for (int64_t r = 0; r <= B; ++r)
        offsets[r] = r;
    for (int64_t r = 0; r < B; ++r) {
        const bool real = r < n;
        const DecodeRow* row = real ? &rows[static_cast<size_t>(r)] : nullptr;
        one_rows[r] = r;
        row_seq[r] = static_cast<int32_t>(r);
        tokens[r] = real ? row->token : 0;
        positions[r] = real ? row->position : 0;
        const int64_t keys = real ? row->position + 1 : 1;
        one_keys[r] = static_cast<int32_t>(keys);
        int32_t* t = table + r * mp;
        if (!real || row->pages == nullptr) {
            std::fill(t, t + mp, pad.page);
        } else {
            const auto held = static_cast<int64_t>(row->pages->size());
            const int64_t need = (keys + page_tokens - 1) / page_tokens;
            HYMOE_CHECK(need <= held && need <= mp,
                        "decode graph metadata: row ",
                        r,
                        " needs ",
                        need,
                        " pages for ",
                        keys,
                        " keys; its table holds ",
                        held,
                        ", the graph's ",
                        mp);
            std::fill(t, t + mp, -1);
            std::copy(row->pages->begin(), row->pages->begin() + std::min(held, mp), t);
        }
        const uint64_t state = real ? row->kda_state : pad.kda_state;
        const int32_t slot = real ? row->kda_slot : pad.kda_slot;
        for (int64_t j = 0; j < kda.n_kda; ++j) {
            states[j * B + r] = state + static_cast<uint64_t>(j * kda.s_floats) * sizeof(float);
            for (int64_t p = 0; p < 3; ++p)  // the layer's q, k, v tails
                states[((p + 1) * kda.n_kda + j) * B + r] =
                    state + static_cast<uint64_t>(kda.n_kda * kda.s_floats + j * kda.tail_floats +
                                                  p * (kda.tail_floats / 3)) *
                                sizeof(float);
            slots[j * B + r] = slot + static_cast<int32_t>(j);
        }
    }
}

}  // namespace hymoe::model
