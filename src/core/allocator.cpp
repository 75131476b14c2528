// glibc malloc tuning for hymoe's allocation pattern (see core/allocator.h).
#include "hymoe/core/allocator.h"

#include <cstdint>
#include <cstdlib>
#include <limits>
#include <malloc.h>
#include <mutex>
#include <sys/mman.h>
#include <unistd.h>

namespace hymoe {

void reuse_freed_memory() {
    mallopt(M_MMAP_THRESHOLD, 1 << 30);  // below 1 GiB: from the heap, reused after free
    mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max());  // never give the heap back
    mallopt(M_TOP_PAD, 256 << 20);                               // grow the heap in 256 MiB steps
}

void reserve_huge_page_heap() {
    static std::once_flag once;
    std::call_once(once, [] {
        constexpr size_t reserve = size_t{3} << 28;  // 768 MiB (+ the 256 MiB top pad)
        constexpr uintptr_t huge = uintptr_t{1} << 21;
        void* block = std::malloc(reserve);
        if (block == nullptr)
            return;
        const auto lo = reinterpret_cast<uintptr_t>(block);
        std::free(block);  // back to the heap's top, which is never trimmed
        const auto hi = reinterpret_cast<uintptr_t>(sbrk(0));
        if (hi <= lo || hi - lo > 2 * reserve)  // not the brk heap: mmap'ed, or another malloc
            return;
        const uintptr_t begin = (lo + huge - 1) & ~(huge - 1), end = hi & ~(huge - 1);
        if (end > begin)
            madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
    });
}

}  // namespace hymoe
