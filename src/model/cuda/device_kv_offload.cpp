// The host tier of the GPU model's KV pages (device_kv_offload.h).
#include "device_kv_offload.h"

#include <algorithm>

#include "hymoe/core/error.h"

namespace hymoe::model::gpu {

namespace {

constexpr int64_t kF = sizeof(float);

int64_t widest(const KvLayout& layout) {
    return layout.width.empty() ? 0 : *std::max_element(layout.width.begin(), layout.width.end());
}

int64_t attention_layers(const KvLayout& layout) {
    return std::count_if(layout.width.begin(), layout.width.end(), [](int64_t w) { return w > 0; });
}

}  // namespace

int64_t HostKvStore::slot_bytes(const KvLayout& layout) {
    return std::min<int64_t>(2, attention_layers(layout)) * layout.capacity * layout.page_tokens *
           widest(layout) * kF;
}

HostKvStore::HostKvStore(const KvLayout& layout, Gpu& g)
    : layout_(layout),
      g_(g),
      slot_page_floats_(layout.page_tokens * widest(layout)),
      host_offset_(layout.width.size(), 0),
      rank_(layout.width.size(), -1) {
    int64_t floats = 0;
    for (size_t l = 0; l < layout.width.size(); ++l) {
        host_offset_[l] = floats;
        floats += layout.capacity * layout.layer_page_floats(static_cast<int>(l));
        if (layout.width[l] > 0) {
            rank_[l] = static_cast<int>(attention_.size());
            attention_.push_back(static_cast<int>(l));
        }
    }
    host_bytes_ = floats * kF;
    if (host_bytes_ > 0)
        host_ = std::make_unique<backend::cuda::PinnedBuffer>(static_cast<size_t>(host_bytes_));
    if (slot_bytes(layout) > 0)
        slots_ = static_cast<float*>(g_.arena.allocate(static_cast<size_t>(slot_bytes(layout))));
}

HostKvStore::~HostKvStore() {
    try {  // no copy may outlive the memory it reads or writes (none is left after a forward)
        copies_.synchronize();
    } catch (const Error&) {  // a failed stream: nothing left to wait for, and no throw here
    }
    if (slots_ != nullptr)
        g_.arena.free(slots_);
}

void HostKvStore::grow(int64_t n) {
    HYMOE_CHECK(n <= layout_.capacity, "host KV pages: page ", n, " of ", layout_.capacity);
}

float* HostKvStore::page(int layer, int32_t page, bool) {
    HYMOE_CHECK(layer >= 0 && static_cast<size_t>(layer) < layout_.width.size() &&
                    layout_.width[static_cast<size_t>(layer)] > 0 && page >= 0 &&
                    page < layout_.capacity,
                "host KV pages: page ",
                page,
                " of layer ",
                layer);
    return static_cast<float*>(host_->data()) + host_offset_[static_cast<size_t>(layer)] +
           page * layout_.layer_page_floats(layer);
}

void HostKvStore::stage_step(const SeqBatch& batch, std::vector<int32_t>& table, StepBatch& step) {
    staging_ = stage_kv_pages(table, step.max_pages, batch, layout_.page_tokens, layout_.capacity);
    table = staging_.table;
    const int64_t slot_floats = layout_.capacity * slot_page_floats_;
    step.pages = slots_;
    step.page_stride = slot_page_floats_;
    step.layer_offset.assign(layout_.width.size(), 0);
    for (int l : attention_)
        step.layer_offset[static_cast<size_t>(l)] = slot_of(l) * slot_floats;
    step.host_kv = this;
    started_.record(g_.stream);  // the last step's users of the slots are queued before this
    backend::cuda::wait_for(copies_, started_);
    for (size_t k = 0; k < std::min<size_t>(2, attention_.size()); ++k)
        fetch(attention_[k]);
}

void HostKvStore::await_layer(int layer) {
    backend::cuda::wait_for(g_.stream, fetched_[slot_of(layer)]);
}

void HostKvStore::release_layer(int layer) {
    const int slot = slot_of(layer);
    released_[slot].record(g_.stream);
    backend::cuda::wait_for(copies_, released_[slot]);
    write_back(layer);
    const auto after_next = static_cast<size_t>(rank_[static_cast<size_t>(layer)] + 2);
    if (after_next < attention_.size())
        fetch(attention_[after_next]);
}

void HostKvStore::finish_step() {
    written_.record(copies_);
    backend::cuda::wait_for(g_.stream, written_);
}

void HostKvStore::fetch(int layer) {
    const int64_t page_floats = layout_.layer_page_floats(layer);
    const float* host =
        static_cast<const float*>(host_->data()) + host_offset_[static_cast<size_t>(layer)];
    float* slot = slots_ + slot_of(layer) * layout_.capacity * slot_page_floats_;
    for (const PageRun& r : staging_.fetch)
        backend::cuda::copy_rows_to_device(slot + r.slot * slot_page_floats_,
                                           static_cast<size_t>(slot_page_floats_ * kF),
                                           host + r.page * page_floats,
                                           static_cast<size_t>(page_floats * kF),
                                           static_cast<size_t>(page_floats * kF),
                                           static_cast<size_t>(r.count),
                                           copies_);
    fetched_[slot_of(layer)].record(copies_);
}

void HostKvStore::write_back(int layer) {
    const int64_t page_floats = layout_.layer_page_floats(layer);
    float* host = static_cast<float*>(host_->data()) + host_offset_[static_cast<size_t>(layer)];
    const float* slot = slots_ + slot_of(layer) * layout_.capacity * slot_page_floats_;
    for (const PageRun& r : staging_.write)
        backend::cuda::copy_rows_to_host(host + r.page * page_floats,
                                         static_cast<size_t>(page_floats * kF),
                                         slot + r.slot * slot_page_floats_,
                                         static_cast<size_t>(slot_page_floats_ * kF),
                                         static_cast<size_t>(page_floats * kF),
                                         static_cast<size_t>(r.count),
                                         copies_);
}

}  // namespace hymoe::model::gpu
