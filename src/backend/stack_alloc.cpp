// StackAllocator (hymoe/backend/stack_alloc.h): a bump pointer with the blocks' starts kept to
// check that they come back last-in, first-out.
#include "hymoe/backend/stack_alloc.h"

#include <algorithm>

#include "hymoe/core/error.h"

namespace hymoe::backend::cuda {

size_t StackAllocator::push(size_t bytes, size_t align) {
    HYMOE_CHECK(align > 0 && (align & (align - 1)) == 0, "workspace stack: alignment ", align);
    const size_t start = (top_ + align - 1) & ~(align - 1);
    const size_t size = std::max<size_t>(bytes, 1);
    HYMOE_CHECK(start <= capacity_ && size <= capacity_ - start,
                "workspace stack: ",
                bytes,
                " bytes at offset ",
                start,
                " do not fit its ",
                capacity_,
                " bytes (",
                blocks_.size(),
                " blocks held)");
    blocks_.push_back({start, top_});
    top_ = start + size;
    peak_ = std::max(peak_, top_);
    return start;
}

void StackAllocator::pop(size_t offset) {
    HYMOE_CHECK(!blocks_.empty() && blocks_.back().offset == offset,
                "workspace stack: release of offset ",
                offset,
                " out of order (the top block is at ",
                blocks_.empty() ? capacity_ : blocks_.back().offset,
                ", ",
                blocks_.size(),
                " blocks held)");
    top_ = blocks_.back().below;
    blocks_.pop_back();
}

}  // namespace hymoe::backend::cuda
