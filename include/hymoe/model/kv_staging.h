// The index logic of a host KV tier that stages one step's pages in device slots (the GPU model's
// `offload: host`, src/model/cuda/device_kv_offload.h), plain C++ in every build. A step's pages
// are each sequence's block table up to its keys after the step (pos0 + length), sequences in
// batch order; a page's slot index is its place in that list, so a slot holds the step's pages
// of one layer as [step pages, page_tokens, width] and the step's block tables are rewritten
// into slot indices. Of those pages, the ones holding rows of earlier steps (token < pos0) are
// fetched into a slot, and the ones this step's rows go to (pos0 ≤ token < pos0 + length) are
// written back; each list as runs of pages consecutive both in the slot and in the pool, one
// copy a run. Block tables are disjoint (kv_cache.h), so a step has at most capacity pages.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "hymoe/model/batch.h"

namespace hymoe::model {

// `count` pages: slot indices [slot, slot + count) ↔ pool pages [page, page + count).
struct PageRun {
    int32_t slot = 0;
    int32_t page = 0;
    int32_t count = 0;
    bool operator==(const PageRun&) const = default;
};

struct KvStaging {
    std::vector<int32_t> pages;  // [step pages] pool page of each slot index
    std::vector<int32_t> table;  // [n_seq, max_pages] slot indices; −1 past a sequence's keys
    std::vector<PageRun> fetch;  // pages with rows of earlier steps, pool to slot
    std::vector<PageRun> write;  // pages this step's rows go to, slot to pool
};

// table: [n_seq, max_pages] the sequences' pool pages in token order (−1 padded), covering each
// sequence's pos0 + length keys; pages in [0, capacity) and in no two sequences (else an
// internal error naming the page).
KvStaging stage_kv_pages(const std::vector<int32_t>& table,
                         int max_pages,
                         const SeqBatch& batch,
                         int page_tokens,
                         int64_t capacity);

// Maximal runs of (slot, page) pairs, given in increasing slot order, whose slot and page both
// step by one.
std::vector<PageRun> page_runs(const std::vector<std::pair<int32_t, int32_t>>& pairs);

}  // namespace hymoe::model
