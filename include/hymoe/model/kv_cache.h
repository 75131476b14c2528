// The paged attention cache (vLLM's PagedAttention block manager, for MLA/DSA): one pool per
// engine lane on a rank, `capacity` pages of page_tokens tokens. A page id stands for the same
// token range in every MLA/DSA layer of the rank's stage, so a sequence holds one block table
// (its page ids in token order) for all of them. A layer's token row is [c_kv | k_r | k_idx]
// (k_idx for DSA layers only), stored in the pool's dtype (inference.kv_cache.dtype: f32, bf16 or
// f16; rows narrow on write, rounding to nearest even, and widen to fp32 on read, so the attention
// math stays fp32 and an f32 pool is bit-exact). Pages get memory on first use and go back to a
// LIFO free list when a sequence finishes or is preempted; the pool never holds more than capacity
// pages. A page may be shared: the prefix cache (runtime/prefix_cache.h) holds the full pages of a
// cached prompt prefix and lends them to the block tables of later prompts that start with it
// (share), each holder counting one reference; only rows past the shared prefix are ever written,
// so a shared page never changes. Invariant: a page with references is in no free list, a page in
// the free list has none, and free_pages() = capacity − pages with references. Where the
// rows live is the pool's KvStore: all in memory (the default), or an offload tier
// (inference.kv_cache.offload; runtime/kv_spill.h) that keeps only the running layer's and the
// next one's pages of a step in memory. The forward tells the pool the step's pages, each layer
// as it starts and the step's end (begin_step, enter_layer, end_step), so that a tier can fetch
// the next layer's pages while a layer runs.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "hymoe/backend/latent_cache.h"
#include "hymoe/model/config.h"
#include "hymoe/model/shard.h"

namespace hymoe::model {

// Floats one token of a layer caches: [c_kv r_kv | k_r d_r | k_idx d_I (dsa)]; 0 for KDA.
int64_t kv_row_floats(const ModelConfig& cfg, Mixer mixer);

// What a store holds: `capacity` pages; a page of layer l is [page_tokens, width[l]] elements of
// dtype.
struct KvLayout {
    int page_tokens = 0;
    int64_t capacity = 0;
    std::vector<int64_t> width;  // [n_layer] elements a token; 0: not an MLA/DSA layer here
    DType dtype = DType::f32;    // f32, bf16 or f16
    int64_t layer_page_floats(int layer) const { return page_tokens * width[layer]; }  // elements
    int64_t layer_page_bytes(int layer) const {
        return layer_page_floats(layer) * static_cast<int64_t>(dtype_size(dtype));
    }
};

// The rows of a pool. Not thread-safe: one forward at a time uses a pool.
class KvStore {
public:
    virtual ~KvStore() = default;
    // Pages [0, n) exist from now on (n only grows; a new page's rows are undefined).
    virtual void grow(int64_t n) = 0;
    // Page `page` of `layer` [page_tokens, width] of the layout's dtype; `write`: the caller
    // changes rows of it.
    virtual void* page(int layer, int32_t page, bool write) = 0;
    // The next forward touches `pages` (its sequences' block tables) in every layer.
    virtual void begin_step(const std::vector<int32_t>& /*pages*/) {}
    // Layer `layer` starts: page() of its step pages works until the next enter_layer/end_step.
    virtual void enter_layer(int /*layer*/) {}
    // The step's layers are done: every change is stored.
    virtual void end_step() {}
    // Bytes of rows held in memory at most so far.
    virtual int64_t peak_resident_bytes() const = 0;
};
using KvStoreFactory = std::function<std::unique_ptr<KvStore>(const KvLayout&)>;

// Every page in memory, all of a page's layers together (allocated as pages are first used).
std::unique_ptr<KvStore> make_memory_kv_store(const KvLayout& layout);

class KvPool {
public:
    // Widths from the local config of the rank's stage (shard: its layers); rows in the store
    // make_store gives (default: make_memory_kv_store), of element type dtype.
    KvPool(const ModelConfig& local,
           const ModelShard& shard,
           int page_tokens,
           int64_t capacity,
           const KvStoreFactory& make_store = {},
           DType dtype = DType::f32);

    int page_tokens() const { return layout_.page_tokens; }
    int64_t capacity() const { return layout_.capacity; }
    int64_t free_pages() const { return capacity() - in_use_; }
    int64_t pages_for(int64_t tokens) const { return (tokens + page_tokens() - 1) / page_tokens(); }
    // Bytes of one page over all the stage's MLA/DSA layers, and in one layer.
    int64_t page_bytes() const;
    int64_t layer_page_bytes(int layer) const;

    // Grows `table` to cover `tokens` tokens; false, with nothing changed, when the free pages
    // do not suffice.
    bool reserve(std::vector<int32_t>& table, int64_t tokens);
    // Drops table's reference to each of its pages (a page with no references left goes back to
    // the free list); table emptied.
    void release(std::vector<int32_t>& table);
    // Appends `pages` (each held by some table already) to `table`, one more reference each.
    void share(std::vector<int32_t>& table, const std::vector<int32_t>& pages);
    // References to page `page` (0: free or never used).
    int32_t refs(int32_t page) const { return refs_[static_cast<size_t>(page)]; }

    int64_t row_width(int layer) const { return layout_.width[static_cast<size_t>(layer)]; }
    DType dtype() const { return layout_.dtype; }  // of the stored rows
    // Elements [offset, offset + n) of the row of token slot `slot` (< page_tokens) of page
    // `page` in `layer` [row_width]: read widened to fp32 into out[n], or written from in[n].
    void read_row(int layer, int32_t page, int64_t slot, int64_t offset, int64_t n, float* out);
    void write_row(
        int layer, int32_t page, int64_t slot, int64_t offset, int64_t n, const float* in);

    // Layer `layer`'s rows of the sequence whose block table is `table`, as a host view
    // (backend/latent_cache.h; block-table row 0 = table) of columns [c_kv r_kv | k_r d_r | k_idx
    // d_i] (r_kv + d_r + d_i = row_width): the pages that hold tokens of [write_from, write_end)
    // fetched for writing, the others for reading. ptrs keeps the page pointers (by page id) the
    // view reads, table the ids: both must outlive it. Valid until the store's next
    // enter_layer/end_step.
    backend::LatentCache latent_view(int layer,
                                     const std::vector<int32_t>& table,
                                     int64_t write_from,
                                     int64_t write_end,
                                     int64_t r_kv,
                                     int64_t d_r,
                                     std::vector<void*>& ptrs);

    // The forward's hooks (see above), passed to the store.
    void begin_step(const std::vector<int32_t>& pages) { store_->begin_step(pages); }
    void enter_layer(int layer) { store_->enter_layer(layer); }
    void end_step() { store_->end_step(); }
    // Bytes of KV rows the store holds in memory, at most so far.
    int64_t peak_resident_bytes() const { return store_->peak_resident_bytes(); }
    // Where the rows live (a device model reads its own store's pages: model/device_model.h).
    KvStore& store() const { return *store_; }

private:
    // The row's first byte.
    unsigned char* at(int layer, int32_t page, int64_t slot, bool write);

    KvLayout layout_;
    int64_t in_use_ = 0, used_ = 0;  // pages with references; pages ever used (ids [0, used_))
    std::vector<int32_t> free_;      // LIFO
    std::vector<int32_t> refs_;      // [used_] references to each page
    std::unique_ptr<KvStore> store_;
};

}  // namespace hymoe::model
