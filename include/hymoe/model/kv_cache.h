// The paged attention cache (vLLM's PagedAttention block manager, for MLA/DSA): one pool per
// engine lane on a rank, `capacity` pages of page_tokens tokens. A page id stands for the same
// token range in every MLA/DSA layer of the rank's stage, so a sequence holds one block table
// (its page ids in token order) for all of them. A layer's token row is [c_kv | k_r | k_idx]
// (k_idx for DSA layers only). Pages get memory on first use and go back to a LIFO free list
// when a sequence finishes or is preempted; the pool never holds more than capacity pages.
// Invariant: a page is in at most one block table or in the free list, never both.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "hymoe/model/config.h"
#include "hymoe/model/shard.h"

namespace hymoe::model {

// Floats one token of a layer caches: [c_kv r_kv | k_r d_r | k_idx d_I (dsa)]; 0 for KDA.
int64_t kv_row_floats(const ModelConfig& cfg, Mixer mixer);

class KvPool {
public:
    // Widths from the local config of the rank's stage (shard: its layers).
    KvPool(const ModelConfig& local, const ModelShard& shard, int page_tokens, int64_t capacity);

    int page_tokens() const { return page_tokens_; }
    int64_t capacity() const { return capacity_; }
    int64_t free_pages() const { return capacity_ - in_use_; }
    int64_t pages_for(int64_t tokens) const { return (tokens + page_tokens_ - 1) / page_tokens_; }
    // Bytes of one page over all the stage's MLA/DSA layers.
    int64_t page_bytes() const;

    // Grows `table` to cover `tokens` tokens; false, with nothing changed, when the free pages
    // do not suffice.
    bool reserve(std::vector<int32_t>& table, int64_t tokens);
    // Every page of `table` back to the free list; table emptied.
    void release(std::vector<int32_t>& table);

    int64_t row_width(int layer) const { return width_[static_cast<size_t>(layer)]; }
    // The row of token slot `slot` (< page_tokens) of page `page` in `layer` [row_width floats].
    float* row(int layer, int32_t page, int64_t slot);

private:
    int page_tokens_;
    int64_t capacity_, in_use_ = 0;
    std::vector<int64_t> width_;                    // [n_layer] floats a token; 0: none here
    std::vector<std::unique_ptr<float[]>> memory_;  // [pages ever used] all layers' rows
    std::vector<int64_t> offset_;                   // [n_layer] a layer's rows in a page
    int64_t page_floats_ = 0;
    std::vector<int32_t> free_;  // LIFO
};

}  // namespace hymoe::model
