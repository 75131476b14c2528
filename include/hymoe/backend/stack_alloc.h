// StackAllocator: the bookkeeping of a workspace whose blocks are given back in the reverse order
// of their allocation (scratch scopes that nest), over the byte range [0, capacity). Every
// allocation of the same sequence of sizes lands at the same offsets, which is what a captured
// CUDA graph needs of its scratch (model/cuda/device_decode_graphs.h). Running out of room and
// giving back any block but the top one both fail (one-rank hymoe::Error), naming the sizes.
// Plain C++ in every build (src/backend/stack_alloc.cpp, unit-tested on the CPU).
#pragma once

#include <cstddef>
#include <vector>

namespace hymoe::backend::cuda {

class StackAllocator {
public:
    explicit StackAllocator(size_t capacity) : capacity_(capacity) {}
    // The offset of a new top block of `bytes` (at least one byte) at a multiple of `align` (a
    // power of two).
    size_t push(size_t bytes, size_t align);
    // Gives back the top block, which must start at `offset`.
    void pop(size_t offset);

    size_t capacity() const { return capacity_; }
    size_t used() const { return top_; }  // the end of the top block (0 when empty)
    size_t peak() const { return peak_; }
    size_t depth() const { return blocks_.size(); }

private:
    struct Block {
        size_t offset, below;  // its start, and the top before it was pushed
    };
    size_t capacity_;
    size_t top_ = 0, peak_ = 0;
    std::vector<Block> blocks_;  // bottom first
};

}  // namespace hymoe::backend::cuda
