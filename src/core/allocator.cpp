// glibc malloc tuning for hymoe's allocation pattern (see core/allocator.h).
#include "hymoe/core/allocator.h"

#include <limits>
#include <malloc.h>

namespace hymoe {

void reuse_freed_memory() {
    mallopt(M_MMAP_THRESHOLD, 1 << 30);  // below 1 GiB: from the heap, reused after free
    mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max());  // never give the heap back
    mallopt(M_TOP_PAD, 256 << 20);                               // grow the heap in 256 MiB steps
}

}  // namespace hymoe
