// The host tier of a GPU model's KV pages (inference.kv_cache.offload: host; DeviceModel::
// host_kv_store): a pool's rows live in pinned host memory and the device holds only the step's
// pages of two attention layers, the one running and the next, in two slots (model/kv_staging.h
// has the index logic: KvTierLayout places the rows, stage_kv_pages plans a step).
//   - Host: every page of the pool, laid out [layer][page] ([capacity, page_tokens, width] a
//     layer), so that pool pages p..p+n of one layer are one contiguous run.
//   - Device: slot k mod 2 for the k-th MLA/DSA layer, [capacity, page_tokens, widest row] (the
//     step's pages in slot order; disjoint block tables keep them within capacity), allocated
//     with the store: the steps of a full pool touch about all of its pages, so slots sized for
//     capacity cost what a busy engine needs anyway, and never move or grow.
//   - A step (DeviceModelOn::make_step calls stage_step): the block tables become slot indices, and
//     StepBatch's pages, page stride and layer offsets point each layer at its slot, so the
//     attention kernels run unchanged. The fetches of the first two attention layers go on the
//     store's copy stream at once, after an event marking where the compute stream stands.
//   - Layer i (the forward calls await_layer before and release_layer after its attention
//     block): the compute stream waits for i's fetch; afterwards the copy stream waits for the
//     compute stream to finish with the slot, copies back the pages the step's new rows went to
//     (only those), and fetches the attention layer after next into the slot, so that a fetch
//     runs while the layers in between compute. finish_step has the compute stream wait for the
//     last write-back, so a forward that returns has every row on the host.
// Copies: one cudaMemcpy2DAsync per run of pages consecutive in both the slot and the pool (the
// pitches differ where a layer is narrower than the widest); only pages with rows of earlier
// steps are fetched. The host rows are readable and writable (page()) between forwards.
// The file tier (inference.kv_cache.offload: file; DeviceModel::file_kv_store): the same store
// with its host rows in a spill file mapped shared (runtime/kv_spill.h make_spill_file: made in
// the output folder or offload_path, unlinked, sparse) instead of pinned memory. The rows then
// live in the kernel's page cache, which writes them back to the file and may reclaim them; the
// copies read and write the mapping as pageable memory, which the driver stages (a write-back
// returns once done, so the host waits for the layer there).
// Invariants: one forward at a time; the store must not outlive its model (it holds its Ctx).
#pragma once

#include <memory>
#include <vector>

#include "../device/device_runtime.h"
#include "hymoe/backend/cuda_arena.h"
#include "hymoe/backend/cuda_async.h"
#include "hymoe/model/kv_cache.h"
#include "hymoe/model/kv_staging.h"

namespace hymoe::model::dev {

class HostKvStore final : public KvStore, public KvTier {
public:
    // fd < 0: pinned host rows; else the spill file fd (owned) mapped as the host rows; ctx a
    // CUDA one.
    HostKvStore(const KvLayout& layout, const backend::Ctx& ctx, int fd);
    ~HostKvStore() override;
    HostKvStore(const HostKvStore&) = delete;
    HostKvStore& operator=(const HostKvStore&) = delete;

    void grow(int64_t n) override;
    // The host rows of `page` in `layer` [page_tokens, width], between forwards.
    void* page(int layer, int32_t page, bool write) override;
    int64_t peak_resident_bytes() const override {  // pinned, all at once; a file's: none
        return file_ ? 0 : at_.host_floats * static_cast<int64_t>(sizeof(float));
    }

    bool on(const backend::Ctx& ctx) const override { return &ctx == &ctx_; }
    // KvTier's; stage_step also queues the first two attention layers' fetches.
    void stage_step(const SeqBatch& batch, std::vector<int32_t>& table, StepBatch& step) override;
    void await_layer(int layer) override;
    void release_layer(int layer) override;
    void finish_step() override;

private:
    void fetch(int layer);       // the staged fetch runs of `layer` into its slot (copy stream)
    void write_back(int layer);  // the staged write runs of `layer` from its slot (copy stream)

    KvTierLayout at_;  // where the rows are, on the host and in the slots
    const backend::Ctx& ctx_;
    const backend::cuda::Stream& stream_;  // ctx_'s
    // The spill file and its shared mapping (the file tier), closed and unmapped with the store.
    struct FileRows {
        int fd = -1;
        void* map = nullptr;
        size_t bytes = 0;
        FileRows() = default;
        FileRows(const FileRows&) = delete;
        FileRows& operator=(const FileRows&) = delete;
        ~FileRows();
    };
    std::unique_ptr<backend::cuda::PinnedBuffer> pinned_;  // the host rows, or
    std::unique_ptr<FileRows> file_;                       //   the spill file's
    float* host_ = nullptr;   // the host rows [layer][capacity, page_tokens, width]
    float* slots_ = nullptr;  // [n_slots, capacity, page_tokens, widest]
    backend::cuda::Stream copies_;
    backend::cuda::Event started_, written_, fetched_[2], released_[2];
    KvStaging staging_;  // the running step's
};

}  // namespace hymoe::model::dev
