// A step's row, block and single-row tables (model/step_tables.h).
#include "hymoe/model/step_tables.h"

#include <algorithm>

#include "hymoe/core/error.h"

namespace hymoe::model {

RowTables row_tables(const SeqBatch& batch) {
    const auto n = static_cast<size_t>(batch.n_tok());
    RowTables t{std::vector<int32_t>(n), std::vector<int64_t>(n), std::vector<int32_t>(n)};
    for (int64_t q = 0; q < batch.n_seq(); ++q)
        for (int64_t r = batch.offsets[q]; r < batch.offsets[q + 1]; ++r) {
            t.row_seq[r] = static_cast<int32_t>(q);
            t.positions[r] = batch.pos0[q] + (r - batch.offsets[q]);
            t.visible[r] = static_cast<int32_t>(t.positions[r] + 1);
        }
    return t;
}

BlockTables block_tables(const SeqBatch& batch,
                         const std::vector<const std::vector<int32_t>*>& pages,
                         int page_tokens) {
    const int64_t n_seq = batch.n_seq();
    HYMOE_CHECK(static_cast<int64_t>(pages.size()) == n_seq,
                "step tables: ",
                pages.size(),
                " block tables for ",
                n_seq,
                " sequences");
    BlockTables t;
    for (const std::vector<int32_t>* p : pages)
        t.max_pages = std::max(t.max_pages, static_cast<int>(p->size()));
    t.table.assign(static_cast<size_t>(n_seq * t.max_pages), -1);
    for (int64_t q = 0; q < n_seq; ++q) {
        const std::vector<int32_t>& p = *pages[q];
        const int64_t keys = batch.pos0[q] + batch.length(q);
        HYMOE_CHECK(static_cast<int64_t>(p.size()) * page_tokens >= keys,
                    "step tables: sequence ",
                    q,
                    "'s block table covers ",
                    static_cast<int64_t>(p.size()) * page_tokens,
                    " tokens, not ",
                    keys);
        std::copy(p.begin(), p.end(), t.table.begin() + q * t.max_pages);
    }
    return t;
}

OneRows one_rows(const SeqBatch& batch, const BlockTables& t) {
    OneRows o;
    for (int64_t q = 0; q < batch.n_seq(); ++q) {
        if (batch.length(q) != 1)
            continue;
        const int64_t keys = batch.pos0[q] + 1;
        o.rows.push_back(batch.offsets[q]);
        o.keys.push_back(static_cast<int32_t>(keys));
        o.table.insert(o.table.end(),
                       t.table.begin() + q * t.max_pages,
                       t.table.begin() + (q + 1) * t.max_pages);
        o.max_keys = std::max(o.max_keys, keys);
    }
    return o;
}

}  // namespace hymoe::model
