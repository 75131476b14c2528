// Process-wide allocator policy: large buffers (activations, MPI's temporaries) come from the heap
// and are reused instead of being mmap'ed and unmapped on every allocation. Each fresh page costs a
// fault, several µs on a VM (measured here: 340k faults were 18% of a prefill, and an all-reduce of
// 64 MiB ran 10x slower). The process keeps its peak heap, as caching allocators do.
#pragma once

namespace hymoe {

// Call once at start-up, before the first large allocation.
void reuse_freed_memory();

// Once per process, when the weights are resident (model::forward calls it): grows the heap's free
// top by 768 MiB (a block malloc'ed and freed; the heap is never trimmed) and advises that range
// MADV_HUGEPAGE, so that the activations' fresh pages fault in 2 MiB at a time, 512 times fewer
// faults (the mid preset's first 4 x 512 prefill took 60k 4 KiB faults, ~1 s of its 10.5 s).
// Nothing is touched: the resident set grows only as pages are used. No-op without
// reuse_freed_memory (the block is then mmap'ed, not heap) and where transparent huge pages are
// off.
void reserve_huge_page_heap();

}  // namespace hymoe
