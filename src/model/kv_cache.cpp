// The paged attention cache pool (model/kv_cache.h).
#include "hymoe/model/kv_cache.h"

#include <limits>

#include "hymoe/core/error.h"

namespace hymoe::model {

int64_t kv_row_floats(const ModelConfig& cfg, Mixer mixer) {
    if (mixer == Mixer::kda)
        return 0;
    return cfg.mla.kv_lora_rank + cfg.mla.qk_rope_head_dim +
           (mixer == Mixer::dsa ? cfg.indexer.head_dim : 0);
}

KvPool::KvPool(const ModelConfig& local, const ModelShard& shard, int page_tokens, int64_t capacity)
    : page_tokens_(page_tokens), capacity_(capacity), width_(local.layers.size(), 0) {
    HYMOE_CHECK(
        page_tokens >= 1 && capacity >= 0 && capacity <= std::numeric_limits<int32_t>::max(),
        "KvPool: ",
        capacity,
        " pages of ",
        page_tokens,
        " tokens");
    offset_.assign(local.layers.size(), 0);
    for (int i = shard.first_layer; i < shard.end_layer; ++i) {
        width_[i] = kv_row_floats(local, local.layers[i].mixer);
        if (width_[i] == 0)
            continue;
        offset_[i] = page_floats_;
        page_floats_ += width_[i] * page_tokens;
    }
}

int64_t KvPool::page_bytes() const {
    return page_floats_ * static_cast<int64_t>(sizeof(float));
}

bool KvPool::reserve(std::vector<int32_t>& table, int64_t tokens) {
    const int64_t more = pages_for(tokens) - static_cast<int64_t>(table.size());
    if (more <= 0)
        return true;
    if (more > free_pages())
        return false;
    for (int64_t k = 0; k < more; ++k) {
        if (free_.empty()) {  // a page never used before: its memory now
            memory_.push_back(std::make_unique<float[]>(static_cast<size_t>(page_floats_)));
            table.push_back(static_cast<int32_t>(memory_.size() - 1));
        } else {
            table.push_back(free_.back());
            free_.pop_back();
        }
    }
    in_use_ += more;
    return true;
}

void KvPool::release(std::vector<int32_t>& table) {
    free_.insert(free_.end(), table.rbegin(), table.rend());
    in_use_ -= static_cast<int64_t>(table.size());
    table.clear();
}

float* KvPool::row(int layer, int32_t page, int64_t slot) {
    HYMOE_CHECK(page >= 0 && static_cast<size_t>(page) < memory_.size() && width_[layer] > 0,
                "KvPool: page ",
                page,
                " of layer ",
                layer);
    return memory_[static_cast<size_t>(page)].get() + offset_[layer] + slot * width_[layer];
}

}  // namespace hymoe::model
