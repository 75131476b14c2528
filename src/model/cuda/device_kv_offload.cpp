// The host tier of a GPU model's KV pages (device_kv_offload.h).
#include "device_kv_offload.h"

#include <cerrno>
#include <cstring>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hymoe/core/error.h"

namespace hymoe::model::dev {

namespace {

constexpr int64_t kF = sizeof(float);

}  // namespace

HostKvStore::FileRows::~FileRows() {
    if (map != nullptr)
        ::munmap(map, bytes);
    ::close(fd);
}

HostKvStore::HostKvStore(const KvLayout& layout, const backend::Ctx& ctx, int fd)
    : at_(layout), ctx_(ctx), stream_(*ctx.stream) {
    if (fd >= 0) {  // owned from here on, also when this throws
        file_ = std::make_unique<FileRows>();
        file_->fd = fd;
    }
    HYMOE_CHECK(layout.dtype == DType::f32, "host-tier KV pages are fp32");
    const auto bytes = static_cast<size_t>(at_.host_floats * kF);
    if (file_ && bytes > 0) {  // the file tier: the spill file's pages are the host rows
        struct stat st {};
        HYMOE_CHECK(::fstat(fd, &st) == 0 && st.st_size >= at_.host_floats * kF,
                    "file-tier KV pages: a spill file shorter than the ",
                    bytes,
                    " bytes of the pool's rows");
        void* map = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        HYMOE_CHECK(map != MAP_FAILED, "file-tier KV pages: mmap: ", std::strerror(errno));
        file_->map = map;
        file_->bytes = bytes;
        host_ = static_cast<float*>(map);
    } else if (bytes > 0) {
        pinned_ = std::make_unique<backend::cuda::PinnedBuffer>(bytes);
        host_ = static_cast<float*>(pinned_->data());
    }
    if (at_.n_slots * at_.slot_floats > 0)
        slots_ = static_cast<float*>(
            ctx_.arena->allocate(static_cast<size_t>(at_.n_slots * at_.slot_floats * kF)));
}

HostKvStore::~HostKvStore() {
    try {  // no copy may outlive the memory it reads or writes (none is left after a forward)
        copies_.synchronize();
    } catch (const Error&) {  // a failed stream: nothing left to wait for, and no throw here
    }
    if (slots_ != nullptr)
        ctx_.arena->free(slots_);
}

void HostKvStore::grow(int64_t n) {
    HYMOE_CHECK(n <= at_.kv.capacity, "host KV pages: page ", n, " of ", at_.kv.capacity);
}

void* HostKvStore::page(int layer, int32_t page, bool) {
    HYMOE_CHECK(layer >= 0 && static_cast<size_t>(layer) < at_.rank.size() &&
                    at_.rank[static_cast<size_t>(layer)] >= 0 && page >= 0 &&
                    page < at_.kv.capacity,
                "host KV pages: page ",
                page,
                " of layer ",
                layer);
    return host_ + at_.host_offset[static_cast<size_t>(layer)] +
           page * at_.kv.layer_page_floats(layer);
}

void HostKvStore::stage_step(const SeqBatch& batch, std::vector<int32_t>& table, StepBatch& step) {
    staging_ = stage_kv_pages(table, step.max_pages, batch, at_.kv.page_tokens, at_.kv.capacity);
    table = staging_.table;
    step.pages = slots_;
    step.page_stride = at_.slot_page_floats;
    step.layer_offset = at_.slot_offset;
    step.host_kv = this;
    started_.record(stream_);  // the last step's users of the slots are queued before this
    backend::cuda::wait_for(copies_, started_);
    for (int k = 0; k < at_.n_slots; ++k)
        fetch(at_.attention[static_cast<size_t>(k)]);
}

void HostKvStore::await_layer(int layer) {
    backend::cuda::wait_for(stream_, fetched_[at_.slot_of(layer)]);
}

void HostKvStore::release_layer(int layer) {
    const int slot = at_.slot_of(layer);
    released_[slot].record(stream_);
    backend::cuda::wait_for(copies_, released_[slot]);
    write_back(layer);
    const auto after_next = static_cast<size_t>(at_.rank[static_cast<size_t>(layer)] + 2);
    if (after_next < at_.attention.size())
        fetch(at_.attention[after_next]);
}

void HostKvStore::finish_step() {
    written_.record(copies_);
    backend::cuda::wait_for(stream_, written_);
}

void HostKvStore::fetch(int layer) {
    const auto page_bytes = static_cast<size_t>(at_.kv.layer_page_floats(layer) * kF);
    const float* host = host_;
    for (const KvTierLayout::Copy& c : at_.copies(layer, staging_.fetch))
        backend::cuda::copy_rows_to_device(slots_ + c.slot,
                                           static_cast<size_t>(at_.slot_page_floats * kF),
                                           host + c.host,
                                           page_bytes,
                                           page_bytes,
                                           static_cast<size_t>(c.pages),
                                           copies_);
    fetched_[at_.slot_of(layer)].record(copies_);
}

void HostKvStore::write_back(int layer) {
    const auto page_bytes = static_cast<size_t>(at_.kv.layer_page_floats(layer) * kF);
    float* host = host_;
    for (const KvTierLayout::Copy& c : at_.copies(layer, staging_.write))
        backend::cuda::copy_rows_to_host(host + c.host,
                                         page_bytes,
                                         slots_ + c.slot,
                                         static_cast<size_t>(at_.slot_page_floats * kF),
                                         page_bytes,
                                         static_cast<size_t>(c.pages),
                                         copies_);
}

std::unique_ptr<KvStore> make_host_kv_store(const KvLayout& layout,
                                            const backend::Ctx& ctx,
                                            int fd) {
    return std::make_unique<HostKvStore>(layout, ctx, fd);
}

}  // namespace hymoe::model::dev
