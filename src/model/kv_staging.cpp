// A step's pages in the slots of a host KV tier (model/kv_staging.h).
#include "hymoe/model/kv_staging.h"

#include <algorithm>

#include "hymoe/core/error.h"

namespace hymoe::model {

std::vector<PageRun> page_runs(const std::vector<std::pair<int32_t, int32_t>>& pairs) {
    std::vector<PageRun> runs;
    for (const auto& [slot, page] : pairs) {
        if (!runs.empty()) {
            PageRun& r = runs.back();
            if (slot == r.slot + r.count && page == r.page + r.count) {
                ++r.count;
                continue;
            }
        }
        runs.push_back({slot, page, 1});
    }
    return runs;
}

KvStaging stage_kv_pages(const std::vector<int32_t>& table,
                         int max_pages,
                         const SeqBatch& batch,
                         int page_tokens,
                         int64_t capacity) {
    const int64_t n_seq = batch.n_seq(), pt = page_tokens;
    HYMOE_CHECK(
        page_tokens > 0 && max_pages > 0 && static_cast<int64_t>(table.size()) == n_seq * max_pages,
        "KV staging: a table of ",
        table.size(),
        " entries for ",
        n_seq,
        " sequences of ",
        max_pages,
        " pages (",
        page_tokens,
        " tokens each)");
    KvStaging k;
    k.table.assign(table.size(), -1);
    std::vector<std::pair<int32_t, int32_t>> fetch, write;  // (slot, page)
    for (int64_t q = 0; q < n_seq; ++q) {
        const int64_t pos0 = batch.pos0[q], keys = pos0 + batch.length(q);
        const int64_t used = (keys + pt - 1) / pt, old = (pos0 + pt - 1) / pt,
                      first_new = pos0 / pt;
        HYMOE_CHECK(used <= max_pages,
                    "KV staging: sequence ",
                    q,
                    " has ",
                    keys,
                    " keys, more than ",
                    max_pages,
                    " pages of ",
                    page_tokens);
        for (int64_t j = 0; j < used; ++j) {
            const int32_t page = table[static_cast<size_t>(q * max_pages + j)];
            HYMOE_CHECK(page >= 0 && page < capacity,
                        "KV staging: sequence ",
                        q,
                        "'s page ",
                        j,
                        " is ",
                        page,
                        ", not in [0, ",
                        capacity,
                        ")");
            const auto slot = static_cast<int32_t>(k.pages.size());
            k.pages.push_back(page);
            k.table[static_cast<size_t>(q * max_pages + j)] = slot;
            if (j < old)
                fetch.emplace_back(slot, page);
            if (j >= first_new)
                write.emplace_back(slot, page);
        }
    }
    std::vector<int32_t> sorted = k.pages;
    std::sort(sorted.begin(), sorted.end());
    const auto twice = std::adjacent_find(sorted.begin(), sorted.end());
    HYMOE_CHECK(twice == sorted.end(),
                "KV staging: page ",
                twice == sorted.end() ? -1 : *twice,
                " is in two block tables of one step");
    k.fetch = page_runs(fetch);
    k.write = page_runs(write);
    return k;
}

KvTierLayout::KvTierLayout(const KvLayout& layout)
    : kv(layout),
      host_offset(layout.width.size(), 0),
      slot_offset(layout.width.size(), 0),
      rank(layout.width.size(), -1) {
    int64_t widest = 0;
    for (size_t l = 0; l < layout.width.size(); ++l) {
        host_offset[l] = host_floats;
        host_floats += layout.capacity * layout.layer_page_floats(static_cast<int>(l));
        widest = std::max(widest, layout.width[l]);
        if (layout.width[l] > 0) {
            rank[l] = static_cast<int>(attention.size());
            attention.push_back(static_cast<int>(l));
        }
    }
    slot_page_floats = layout.page_tokens * widest;
    slot_floats = layout.capacity * slot_page_floats;
    n_slots = static_cast<int>(std::min<size_t>(2, attention.size()));
    for (int l : attention)
        slot_offset[static_cast<size_t>(l)] = slot_of(l) * slot_floats;
}

std::vector<KvTierLayout::Copy> KvTierLayout::copies(int layer,
                                                     const std::vector<PageRun>& runs) const {
    HYMOE_CHECK(layer >= 0 && static_cast<size_t>(layer) < rank.size() &&
                    rank[static_cast<size_t>(layer)] >= 0,
                "KV tier: layer ",
                layer,
                " has no KV pages");
    const int64_t page_floats = kv.layer_page_floats(layer);
    std::vector<Copy> out;
    out.reserve(runs.size());
    for (const PageRun& r : runs)
        out.push_back({host_offset[static_cast<size_t>(layer)] + r.page * page_floats,
                       slot_offset[static_cast<size_t>(layer)] + r.slot * slot_page_floats,
                       r.count});
    return out;
}

}  // namespace hymoe::model
