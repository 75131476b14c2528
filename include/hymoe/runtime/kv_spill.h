// The `file` tier of inference.kv_cache.offload (CPU builds): a KV pool's pages live in a spill
// file and memory holds only two slots of the running step's pages: the MLA/DSA layer that runs
// and the next one, which a helper thread fills while the layer computes (model/kv_cache.h's
// hooks: begin_step fetches the stage's first two attention layers; enter_layer(i) writes the
// pages layer i−1 changed back, hands its slot to the attention layer after i and waits for i's).
// The file: made with mkstemp in a folder (the job's output folder or kv_cache.offload_path),
// removed at once so that it goes with the process, sized capacity × page bytes (sparse: only
// pages written take disk), laid out [layer][page] ([capacity, page_tokens, width] a layer) and
// mapped read-only: a fetch advises MADV_WILLNEED over the step's pages, copies them into the
// slot and drops the mapping's pages again (MADV_DONTNEED), so the process holds only the slots;
// write-backs are pwrite()s of the changed pages. The file's pages sit in the kernel's page
// cache, which the kernel reclaims under memory pressure. The stores of a rank's lanes can share
// one pair of slots (SpillSlots): only one forward runs at a time on a rank. On the GPU the file
// is made the same way (make_spill_file) and the device model's store maps it as its host rows
// (model/device_model.h file_kv_store).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "hymoe/model/kv_cache.h"

namespace hymoe::runtime {

// The bytes of a spill file for a pool with `layout`: capacity × Σ over layers of a page's bytes.
int64_t spill_file_bytes(const model::KvLayout& layout);

// A spill file of `bytes` (sparse) in `dir`, made with mkstemp and unlinked at once, open
// read-write; the caller closes the descriptor. Fails (exit 2, naming `key`) when it cannot be
// made or sized.
int make_spill_file(const std::string& dir, const std::string& key, int64_t bytes);

struct SpillStats {
    std::vector<int> loads;     // the layers fetched in the latest step, in the order issued
    int64_t bytes_read = 0;     // copied from the file into the slots
    int64_t bytes_written = 0;  // written back
    double read_seconds = 0;    // the helper thread's time in fetches
    int64_t file_bytes = 0;     // the file's size (sparse)
    int64_t spilled_bytes = 0;  // pages ever used × their bytes over the layers
};

// The two slots' rows: [step pages, page_tokens, width] of the layer a slot holds.
struct SpillSlots {
    std::vector<unsigned char> rows[2];  // bytes of the layout's dtype
};

class SpillKvStore final : public model::KvStore {
public:
    // Fails (exit 2, naming `key`) when no spill file can be made in `dir`. `totals`, when
    // given, gets this store's stats added at destruction (the loads list aside). `slots`: rows
    // shared with other stores whose forwards never overlap this one's (null: its own).
    SpillKvStore(const model::KvLayout& layout,
                 const std::string& dir,
                 const std::string& key,
                 SpillStats* totals = nullptr,
                 std::shared_ptr<SpillSlots> slots = nullptr);
    ~SpillKvStore() override;
    SpillKvStore(const SpillKvStore&) = delete;
    SpillKvStore& operator=(const SpillKvStore&) = delete;

    void grow(int64_t n) override;
    void* page(int layer, int32_t page, bool write) override;
    void begin_step(const std::vector<int32_t>& pages) override;
    void enter_layer(int layer) override;
    void end_step() override;
    // What this store grew the slots by (summed over the stores sharing them: their size).
    int64_t peak_resident_bytes() const override { return peak_; }
    SpillStats stats() const;

private:
    struct Slot {
        std::vector<char> dirty;  // [step pages] changed since fetched
        int layer = -1;           // −1: none
        bool ready = false;       // its fetch has finished
    };
    int next_layer(int layer) const;  // the stage's next MLA/DSA layer after `layer`; −1: none
    int slot_of(int layer) const;
    void fetch(int slot, int layer);  // queued: the step's pages of `layer` into the slot
    void write_back(int slot);        // queued: the slot's changed pages to the file
    void post(std::function<void()> task);
    void wait(const std::function<bool()>& done);  // and fail on a helper-thread error
    void work();                                   // the helper thread

    model::KvLayout layout_;
    std::string dir_, key_;
    SpillStats* totals_;
    int fd_ = -1;
    const char* map_ = nullptr;
    int64_t map_bytes_ = 0, used_ = 0, peak_ = 0, max_page_bytes_ = 0;
    std::vector<int64_t> base_;      // [n_layer] byte offset of a layer's pages in the file
    std::vector<int32_t> pages_;     // the step's pages
    std::vector<int32_t> position_;  // [used] a page's position in pages_; −1: not in the step
    Slot slots_[2];
    std::shared_ptr<SpillSlots> rows_;  // the slots' rows
    int current_ = -1;                  // the slot of the running layer
    SpillStats stats_;

    mutable std::mutex mutex_;
    std::condition_variable cv_;
    std::deque<std::function<void()>> tasks_;
    bool busy_ = false, quit_ = false;
    std::string error_;  // the helper thread's first failure
    std::thread worker_;
};

}  // namespace hymoe::runtime
