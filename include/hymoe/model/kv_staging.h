// The index logic of a host KV tier that stages one step's pages in device slots (the GPU model's
// `offload: host`, src/model/cuda/device_kv_offload.h), plain C++ in every build. A step's pages
// are each sequence's block table up to its keys after the step (pos0 + length), sequences in
// batch order; a page's slot index is its place in that list, so a slot holds the step's pages
// of one layer as [step pages, page_tokens, width] and the step's block tables are rewritten
// into slot indices. Of those pages, the ones holding rows of earlier steps (token < pos0) are
// fetched into a slot, and the ones this step's rows go to (pos0 ≤ token < pos0 + length) are
// written back; each list as runs of pages consecutive both in the slot and in the pool, one
// copy a run. Block tables are disjoint (kv_cache.h), so a step has at most capacity pages.
// KvTierLayout places the rows: on the host [layer][page] ([capacity, page_tokens, width] a
// layer), in a slot [capacity, page_tokens, widest] (attention layer k in slot k mod 2), and
// turns runs into strided copies between the two.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "hymoe/model/batch.h"
#include "hymoe/model/kv_cache.h"

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

// Where a host tier keeps a pool's rows (floats from the start of the host rows, and of the
// slots, which follow one another).
struct KvTierLayout {
    explicit KvTierLayout(const KvLayout& layout);

    // `pages` pages of `page_floats` floats: host + i·page_floats ↔ slot + i·slot_page_floats.
    struct Copy {
        int64_t host = 0, slot = 0, pages = 0;
    };
    // The copies of `runs` in `layer` (an MLA/DSA layer), one a run.
    std::vector<Copy> copies(int layer, const std::vector<PageRun>& runs) const;
    int slot_of(int layer) const { return rank[static_cast<size_t>(layer)] % 2; }

    KvLayout kv;
    int64_t slot_page_floats = 0;      // page_tokens × the widest row
    int64_t slot_floats = 0;           // capacity × slot_page_floats
    int n_slots = 0;                   // min(2, attention layers)
    int64_t host_floats = 0;           // capacity × Σ layer page floats
    std::vector<int64_t> host_offset;  // [n_layer] a layer's first float in the host rows
    std::vector<int64_t> slot_offset;  // [n_layer] its slot's first float (StepBatch layer_offset)
    std::vector<int> attention;        // the MLA/DSA layers, in order
    std::vector<int> rank;             // [n_layer] place in `attention`; −1: none
};

}  // namespace hymoe::model
