// The host side of a step's packed batch on a device (the GPU model's step, uploaded one small
// copy each): each row's sequence, position and visible keys; the sequences' block tables over a
// KV pool's pages; and the single-row sequences (decode) that one paged attention launch reads.
// Plain C++, so that the tables are tested on the CPU (tests/unit/model/test_step_tables.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include "hymoe/model/batch.h"

namespace hymoe::model {

struct RowTables {
    std::vector<int32_t> row_seq;    // [n_tok] the sequence of each row
    std::vector<int64_t> positions;  // [n_tok] its absolute position
    std::vector<int32_t> visible;  // [n_tok] the keys it sees: its position + 1 (its own included)
};
RowTables row_tables(const SeqBatch& batch);

struct BlockTables {
    int max_pages = 1;           // the longest table (at least 1)
    std::vector<int32_t> table;  // [n_seq, max_pages] page ids in token order, −1 past the end
};
// pages[q]: sequence q's block table in a pool of page_tokens tokens a page. Fails
// (Exit::internal) where a table covers fewer tokens than its sequence's keys after the step.
BlockTables block_tables(const SeqBatch& batch,
                         const std::vector<const std::vector<int32_t>*>& pages,
                         int page_tokens);

struct OneRows {
    std::vector<int64_t> rows;   // [n_one] the row of each sequence with one row this step
    std::vector<int32_t> table;  // [n_one, max_pages] its block table (t's, as given)
    std::vector<int32_t> keys;   // [n_one] its keys after the step, its own included
    int64_t max_keys = 0;
};
// The single-row sequences of batch over t (block tables as the step's attention reads them).
OneRows one_rows(const SeqBatch& batch, const BlockTables& t);

}  // namespace hymoe::model
