// The paged attention cache pool and its in-memory store (model/kv_cache.h).
#include "hymoe/model/kv_cache.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "hymoe/core/error.h"

namespace hymoe::model {

int64_t kv_row_floats(const ModelConfig& cfg, Mixer mixer) {
    if (mixer == Mixer::kda)
        return 0;
    return cfg.mla.kv_lora_rank + cfg.mla.qk_rope_head_dim +
           (mixer == Mixer::dsa ? cfg.indexer.head_dim : 0);
}

namespace {

// One allocation per page holding its rows of every layer, layer after layer.
class MemoryKvStore final : public KvStore {
public:
    explicit MemoryKvStore(const KvLayout& layout) : offset_(layout.width.size(), 0) {
        for (size_t l = 0; l < layout.width.size(); ++l) {
            offset_[l] = page_bytes_;
            page_bytes_ += layout.layer_page_bytes(static_cast<int>(l));
        }
    }
    void grow(int64_t n) override {  // float-aligned, as every dtype needs
        const auto floats = static_cast<size_t>((page_bytes_ + 3) / 4);
        while (static_cast<int64_t>(memory_.size()) < n)
            memory_.push_back(std::make_unique<float[]>(floats));
    }
    void* page(int layer, int32_t page, bool) override {
        return reinterpret_cast<unsigned char*>(memory_[static_cast<size_t>(page)].get()) +
               offset_[static_cast<size_t>(layer)];
    }
    int64_t peak_resident_bytes() const override {  // pages are never given back
        return static_cast<int64_t>(memory_.size()) * page_bytes_;
    }

private:
    std::vector<int64_t> offset_;  // [n_layer] a layer's first byte in a page
    int64_t page_bytes_ = 0;
    std::vector<std::unique_ptr<float[]>> memory_;  // [pages ever used] all layers' rows
};

}  // namespace

std::unique_ptr<KvStore> make_memory_kv_store(const KvLayout& layout) {
    return std::make_unique<MemoryKvStore>(layout);
}

KvPool::KvPool(const ModelConfig& local,
               const ModelShard& shard,
               int page_tokens,
               int64_t capacity,
               const KvStoreFactory& make_store,
               DType dtype) {
    HYMOE_CHECK(
        page_tokens >= 1 && capacity >= 0 && capacity <= std::numeric_limits<int32_t>::max(),
        "KvPool: ",
        capacity,
        " pages of ",
        page_tokens,
        " tokens");
    HYMOE_CHECK(dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16,
                "KvPool: rows of ",
                to_string(dtype));
    layout_.dtype = dtype;
    layout_.page_tokens = page_tokens;
    layout_.capacity = capacity;
    layout_.width.assign(local.layers.size(), 0);
    for (int i = shard.first_layer; i < shard.end_layer; ++i)
        layout_.width[i] = kv_row_floats(local, local.layers[i].mixer);
    store_ = make_store ? make_store(layout_) : make_memory_kv_store(layout_);
}

int64_t KvPool::page_bytes() const {
    int64_t bytes = 0;
    for (size_t l = 0; l < layout_.width.size(); ++l)
        bytes += layer_page_bytes(static_cast<int>(l));
    return bytes;
}

int64_t KvPool::layer_page_bytes(int layer) const {
    return layout_.layer_page_bytes(layer);
}

bool KvPool::reserve(std::vector<int32_t>& table, int64_t tokens) {
    const int64_t more = pages_for(tokens) - static_cast<int64_t>(table.size());
    if (more <= 0)
        return true;
    if (more > free_pages())
        return false;
    for (int64_t k = 0; k < more; ++k) {
        if (free_.empty()) {  // a page never used before: its memory now
            store_->grow(used_ + 1);
            table.push_back(static_cast<int32_t>(used_++));
            refs_.push_back(0);
        } else {
            table.push_back(free_.back());
            free_.pop_back();
        }
        refs_[static_cast<size_t>(table.back())] = 1;
    }
    in_use_ += more;
    return true;
}

void KvPool::release(std::vector<int32_t>& table) {
    for (auto it = table.rbegin(); it != table.rend(); ++it) {
        int32_t& r = refs_[static_cast<size_t>(*it)];
        HYMOE_CHECK(r > 0, "KvPool: page ", *it, " released with no reference");
        if (--r == 0) {
            free_.push_back(*it);
            --in_use_;
        }
    }
    table.clear();
}

void KvPool::share(std::vector<int32_t>& table, const std::vector<int32_t>& pages) {
    for (int32_t page : pages) {
        HYMOE_CHECK(page >= 0 && page < used_ && refs_[static_cast<size_t>(page)] > 0,
                    "KvPool: sharing page ",
                    page,
                    ", which no table holds");
        ++refs_[static_cast<size_t>(page)];
        table.push_back(page);
    }
}

unsigned char* KvPool::at(int layer, int32_t page, int64_t slot, bool write) {
    HYMOE_CHECK(page >= 0 && page < used_ && row_width(layer) > 0,
                "KvPool: page ",
                page,
                " of layer ",
                layer);
    return static_cast<unsigned char*>(store_->page(layer, page, write)) +
           slot * row_width(layer) * static_cast<int64_t>(dtype_size(layout_.dtype));
}

backend::LatentCache KvPool::latent_view(int layer,
                                         const std::vector<int32_t>& table,
                                         int64_t write_from,
                                         int64_t write_end,
                                         int64_t r_kv,
                                         int64_t d_r,
                                         std::vector<void*>& ptrs) {
    const int64_t width = row_width(layer);
    HYMOE_CHECK(width > 0 && r_kv + d_r <= width && !table.empty(),
                "KvPool: a view of layer ",
                layer,
                " (rows of ",
                width,
                ") as ",
                r_kv,
                " + ",
                d_r,
                " columns over ",
                table.size(),
                " pages");
    ptrs.assign(static_cast<size_t>(*std::max_element(table.begin(), table.end())) + 1, nullptr);
    for (size_t k = 0; k < table.size(); ++k) {
        const auto first = static_cast<int64_t>(k) * page_tokens();  // the page's first token
        const bool write = first + page_tokens() > write_from && first < write_end;
        ptrs[static_cast<size_t>(table[k])] = at(layer, table[k], 0, write);
    }
    backend::LatentCache v;
    v.dtype = layout_.dtype;
    v.r_kv = r_kv;
    v.d_r = d_r;
    v.d_i = width - r_kv - d_r;
    v.page_tokens = page_tokens();
    v.row_stride = width;
    v.page_ptr = ptrs.data();
    v.block_table = table.data();
    v.max_pages = static_cast<int>(table.size());
    return v;
}

void KvPool::read_row(
    int layer, int32_t page, int64_t slot, int64_t offset, int64_t n, float* out) {
    const unsigned char* row = at(layer, page, slot, false);
    if (layout_.dtype == DType::f32) {
        std::memcpy(out, row + offset * 4, static_cast<size_t>(n) * 4);
        return;
    }
    const auto* h = reinterpret_cast<const uint16_t*>(row) + offset;
    if (layout_.dtype == DType::bf16)
        for (int64_t i = 0; i < n; ++i)
            out[i] = bf16_to_float(h[i]);
    else
        for (int64_t i = 0; i < n; ++i)
            out[i] = f16_to_float(h[i]);
}

void KvPool::write_row(
    int layer, int32_t page, int64_t slot, int64_t offset, int64_t n, const float* in) {
    unsigned char* row = at(layer, page, slot, true);
    if (layout_.dtype == DType::f32) {
        std::memcpy(row + offset * 4, in, static_cast<size_t>(n) * 4);
        return;
    }
    auto* h = reinterpret_cast<uint16_t*>(row) + offset;
    if (layout_.dtype == DType::bf16)
        for (int64_t i = 0; i < n; ++i)
            h[i] = float_to_bf16(in[i]);
    else
        for (int64_t i = 0; i < n; ++i)
            h[i] = float_to_f16(in[i]);
}

}  // namespace hymoe::model
