// The spill-file tier of the KV pool (runtime/kv_spill.h).
#include "hymoe/runtime/kv_spill.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "hymoe/core/error.h"
#include "hymoe/core/timer.h"

namespace hymoe::runtime {

namespace {

const int64_t kOsPage = 4096;

// [from, to) widened to whole OS pages of the mapping at `map`.
void advise(const char* map, int64_t from, int64_t to, int advice) {
    const int64_t lo = from / kOsPage * kOsPage, hi = (to + kOsPage - 1) / kOsPage * kOsPage;
    if (hi > lo)
        ::madvise(const_cast<char*>(map) + lo, static_cast<size_t>(hi - lo), advice);
}

}  // namespace

int64_t spill_file_bytes(const model::KvLayout& layout) {
    int64_t bytes = 0;
    for (size_t l = 0; l < layout.width.size(); ++l)
        bytes += layout.capacity * layout.layer_page_bytes(static_cast<int>(l));
    return bytes;
}

int make_spill_file(const std::string& dir, const std::string& key, int64_t bytes) {
    std::string name = dir + "/hymoe-kv-XXXXXX";
    const int fd = ::mkstemp(name.data());
    if (fd < 0)
        HYMOE_FAIL_ONE(Exit::invalid,
                       key,
                       ": cannot create a spill file in ",
                       dir,
                       ": ",
                       std::strerror(errno));
    ::unlink(name.c_str());  // the file goes when the process closes it, even when killed
    if (bytes > 0 && ::ftruncate(fd, bytes) != 0) {
        const int err = errno;
        ::close(fd);
        HYMOE_FAIL_ONE(Exit::invalid,
                       key,
                       ": cannot size a spill file in ",
                       dir,
                       " to ",
                       bytes,
                       " bytes: ",
                       std::strerror(err));
    }
    return fd;
}

SpillKvStore::SpillKvStore(const model::KvLayout& layout,
                           const std::string& dir,
                           const std::string& key,
                           SpillStats* totals,
                           std::shared_ptr<SpillSlots> slots)
    : layout_(layout),
      dir_(dir),
      key_(key),
      totals_(totals),
      base_(layout.width.size(), 0),
      rows_(slots ? std::move(slots) : std::make_shared<SpillSlots>()) {
    for (size_t l = 0; l < layout.width.size(); ++l) {
        const int64_t bytes = layout.layer_page_bytes(static_cast<int>(l));
        base_[l] = map_bytes_;
        map_bytes_ += layout.capacity * bytes;
        max_page_bytes_ = std::max(max_page_bytes_, bytes);
    }
    fd_ = make_spill_file(dir, key, map_bytes_);
    stats_.file_bytes = map_bytes_;
    if (map_bytes_ > 0) {
        void* p = ::mmap(nullptr, static_cast<size_t>(map_bytes_), PROT_READ, MAP_SHARED, fd_, 0);
        if (p == MAP_FAILED)
            HYMOE_FAIL_ONE(Exit::invalid,
                           key,
                           ": cannot map the spill file in ",
                           dir,
                           ": ",
                           std::strerror(errno));
        map_ = static_cast<const char*>(p);
    }
    worker_ = std::thread([this] { work(); });
}

SpillKvStore::~SpillKvStore() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        quit_ = true;
    }
    cv_.notify_all();
    worker_.join();
    if (totals_) {
        totals_->bytes_read += stats_.bytes_read, totals_->bytes_written += stats_.bytes_written;
        totals_->read_seconds += stats_.read_seconds, totals_->file_bytes += stats_.file_bytes;
        totals_->spilled_bytes += stats_.spilled_bytes;
    }
    if (map_)
        ::munmap(const_cast<char*>(map_), static_cast<size_t>(map_bytes_));
    ::close(fd_);
}

void SpillKvStore::grow(int64_t n) {
    used_ = std::max(used_, n);
    stats_.spilled_bytes = map_bytes_ / std::max<int64_t>(layout_.capacity, 1) * used_;
}

void* SpillKvStore::page(int layer, int32_t page, bool write) {
    HYMOE_CHECK(current_ >= 0 && slots_[current_].layer == layer && page < used_ &&
                    position_[static_cast<size_t>(page)] >= 0,
                "spill tier: page ",
                page,
                " of layer ",
                layer,
                " is not fetched (not in the step, or not the layer entered)");
    Slot& s = slots_[current_];
    const int32_t k = position_[static_cast<size_t>(page)];
    if (write)
        s.dirty[static_cast<size_t>(k)] = 1;
    return rows_->rows[current_].data() + k * layout_.layer_page_bytes(layer);
}

int SpillKvStore::next_layer(int layer) const {
    for (size_t l = static_cast<size_t>(layer + 1); l < layout_.width.size(); ++l)
        if (layout_.width[l] > 0)
            return static_cast<int>(l);
    return -1;
}

int SpillKvStore::slot_of(int layer) const {
    for (int k = 0; k < 2; ++k)
        if (slots_[k].layer == layer)
            return k;
    return -1;
}

void SpillKvStore::begin_step(const std::vector<int32_t>& pages) {
    wait([this] { return tasks_.empty() && !busy_; });
    pages_ = pages;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stats_.loads.clear();
    }
    position_.assign(static_cast<size_t>(used_), -1);
    for (size_t k = 0; k < pages.size(); ++k) {
        HYMOE_CHECK(pages[k] >= 0 && pages[k] < used_, "spill tier: page ", pages[k]);
        position_[static_cast<size_t>(pages[k])] = static_cast<int32_t>(k);
    }
    const auto bytes = static_cast<size_t>(static_cast<int64_t>(pages.size()) * max_page_bytes_);
    const int first = next_layer(-1);
    for (int k = 0; k < 2; ++k) {  // a stage with one MLA/DSA layer needs one slot
        Slot& s = slots_[k];
        std::vector<unsigned char>& rows = rows_->rows[k];
        if (rows.size() < bytes && (k == 0 ? first >= 0 : first >= 0 && next_layer(first) >= 0)) {
            peak_ += static_cast<int64_t>(bytes - rows.size());
            rows.resize(bytes);
        }
        s.dirty.assign(pages.size(), 0);
        s.layer = -1;
    }
    current_ = -1;
    if (first >= 0) {
        fetch(0, first);
        if (next_layer(first) >= 0)
            fetch(1, next_layer(first));
    }
}

void SpillKvStore::enter_layer(int layer) {
    HYMOE_CHECK(layer >= 0 && static_cast<size_t>(layer) < layout_.width.size() &&
                    layout_.width[static_cast<size_t>(layer)] > 0,
                "spill tier: layer ",
                layer,
                " has no KV pages here");
    if (current_ >= 0 && slots_[current_].layer == layer)
        return;  // running already
    if (current_ >= 0)
        write_back(current_);
    int b = slot_of(layer);
    if (b < 0) {  // not fetched ahead: into the slot just left (or the first)
        b = std::max(current_, 0);
        fetch(b, layer);
    }
    const int a = 1 - b, next = next_layer(layer);
    if (next >= 0 && slots_[a].layer != next)  // a is clean: written back, or fetched ahead
        fetch(a, next);
    wait([this, b] { return slots_[b].ready; });
    current_ = b;
}

void SpillKvStore::end_step() {
    if (current_ >= 0)
        write_back(current_);
    wait([this] { return tasks_.empty() && !busy_; });
    for (Slot& s : slots_)
        s.layer = -1;
    current_ = -1;
}

SpillStats SpillKvStore::stats() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
}

void SpillKvStore::fetch(int slot, int layer) {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        slots_[slot].layer = layer;
        slots_[slot].ready = false;
        stats_.loads.push_back(layer);
    }
    post([this, slot, layer, used = used_] {
        const double t0 = wall_seconds();
        Slot& s = slots_[slot];
        const int64_t bytes = layout_.layer_page_bytes(layer);
        const int64_t base = base_[static_cast<size_t>(layer)];
        for (int32_t p : pages_)  // the kernel reads them ahead, in parallel with the copies
            advise(map_, base + p * bytes, base + (p + 1) * bytes, MADV_WILLNEED);
        for (size_t k = 0; k < pages_.size(); ++k)
            std::memcpy(rows_->rows[slot].data() + static_cast<int64_t>(k) * bytes,
                        map_ + base + pages_[k] * bytes,
                        static_cast<size_t>(bytes));
        advise(map_, base, base + used * bytes, MADV_DONTNEED);  // out of the resident set
        std::lock_guard<std::mutex> lock(mutex_);
        s.ready = true;
        stats_.bytes_read += bytes * static_cast<int64_t>(pages_.size());
        stats_.read_seconds += wall_seconds() - t0;
    });
}

void SpillKvStore::write_back(int slot) {
    const int layer = slots_[slot].layer;
    post([this, slot, layer] {
        Slot& s = slots_[slot];
        const int64_t bytes = layout_.layer_page_bytes(layer);
        int64_t written = 0;
        for (size_t k = 0; k < pages_.size(); ++k) {
            if (!s.dirty[k])
                continue;
            s.dirty[k] = 0;
            const auto* from = rows_->rows[slot].data() + static_cast<int64_t>(k) * bytes;
            const int64_t at = base_[static_cast<size_t>(layer)] + pages_[k] * bytes;
            for (int64_t done = 0; done < bytes;) {
                const ssize_t n =
                    ::pwrite(fd_, from + done, static_cast<size_t>(bytes - done), at + done);
                if (n < 0 && errno == EINTR)
                    continue;
                if (n <= 0) {
                    std::lock_guard<std::mutex> lock(mutex_);
                    if (error_.empty())
                        error_ = cat(key_,
                                     ": writing the spill file in ",
                                     dir_,
                                     ": ",
                                     n < 0 ? std::strerror(errno) : "no progress");
                    return;
                }
                done += n;
            }
            written += bytes;
        }
        std::lock_guard<std::mutex> lock(mutex_);
        stats_.bytes_written += written;
    });
}

void SpillKvStore::post(std::function<void()> task) {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        tasks_.push_back(std::move(task));
    }
    cv_.notify_all();
}

void SpillKvStore::wait(const std::function<bool()>& done) {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return done() || !error_.empty(); });
    if (!error_.empty())
        HYMOE_FAIL_ONE(Exit::invalid, error_);
}

void SpillKvStore::work() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
        cv_.wait(lock, [this] { return quit_ || !tasks_.empty(); });
        if (tasks_.empty())
            return;  // quit, with nothing left to do
        std::function<void()> task = std::move(tasks_.front());
        tasks_.pop_front();
        busy_ = true;
        lock.unlock();
        task();
        lock.lock();
        busy_ = false;
        cv_.notify_all();
    }
}

}  // namespace hymoe::runtime
