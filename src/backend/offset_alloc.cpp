// OffsetAllocator (hymoe/backend/cuda_arena.h): first-fit over free blocks ordered by offset,
// alignment padding left free in front of the block, neighbours merged on free. Plain C++ in
// every build; DeviceArena (src/backend/cuda/memory.cu) maps its offsets onto one cudaMalloc.
#include <algorithm>
#include <iterator>

#include "hymoe/backend/cuda_arena.h"
#include "hymoe/core/error.h"

namespace hymoe::backend::cuda {

namespace {

size_t align_up(size_t x, size_t align) {
    return (x + align - 1) & ~(align - 1);
}

}  // namespace

OffsetAllocator::OffsetAllocator(size_t capacity) : capacity_(capacity) {
    reset();
}

void OffsetAllocator::reset() {
    free_.clear();
    live_.clear();
    used_ = 0;
    if (capacity_ > 0)
        free_[0] = capacity_;
}

size_t OffsetAllocator::allocate(size_t bytes, size_t align) {
    HYMOE_CHECK(align > 0 && (align & (align - 1)) == 0, "arena: alignment ", align);
    const size_t size = align_up(std::max<size_t>(bytes, 1), align);
    for (auto it = free_.begin(); it != free_.end(); ++it) {
        const size_t begin = it->first, end = it->first + it->second;
        const size_t start = align_up(begin, align);
        if (start >= end || end - start < size)
            continue;
        free_.erase(it);
        if (start > begin)
            free_[begin] = start - begin;  // the alignment padding stays free
        if (start + size < end)
            free_[start + size] = end - (start + size);
        live_[start] = size;
        used_ += size;
        peak_ = std::max(peak_, used_);
        return start;
    }
    return none;
}

void OffsetAllocator::free(size_t offset) {
    auto live = live_.find(offset);
    HYMOE_CHECK(live != live_.end(), "arena: free of offset ", offset, " that is not allocated");
    size_t begin = offset, size = live->second;
    used_ -= size;
    live_.erase(live);
    auto next = free_.lower_bound(begin);
    if (next != free_.end() && next->first == begin + size) {  // merge with the block after
        size += next->second;
        next = free_.erase(next);
    }
    if (next != free_.begin()) {  // merge with the block before
        auto prev = std::prev(next);
        if (prev->first + prev->second == begin) {
            begin = prev->first;
            size += prev->second;
            free_.erase(prev);
        }
    }
    free_[begin] = size;
}

size_t OffsetAllocator::largest_free() const {
    size_t best = 0;
    for (const auto& [offset, size] : free_)
        best = std::max(best, size);
    return best;
}

}  // namespace hymoe::backend::cuda
