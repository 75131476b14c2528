// Rows of a step per LoRA adapter, and of an expert-grouped buffer per (expert, adapter)
// (model/lora_rows.h).
#include "hymoe/model/lora_rows.h"

#include "hymoe/core/error.h"

namespace hymoe::model {

namespace {

// rows_of[a] for adapters a in [0, n_adapters) of `row_adapter` over rows [begin, end), appended
// to out as segments of `group`.
void add_segments(LoraRows& out,
                  int64_t group,
                  const std::vector<int>& row_adapter,
                  int64_t begin,
                  int64_t end,
                  int n_adapters) {
    std::vector<std::vector<int64_t>> rows_of(static_cast<size_t>(n_adapters));
    for (int64_t r = begin; r < end; ++r) {
        const int a = row_adapter[static_cast<size_t>(r)];
        if (a >= 0 && a < n_adapters)
            rows_of[static_cast<size_t>(a)].push_back(r);
    }
    for (int a = 0; a < n_adapters; ++a) {
        const std::vector<int64_t>& rows = rows_of[static_cast<size_t>(a)];
        if (rows.empty())
            continue;
        out.segments.push_back(
            {group, a, static_cast<int64_t>(out.rows.size()), static_cast<int64_t>(rows.size())});
        out.rows.insert(out.rows.end(), rows.begin(), rows.end());
    }
}

}  // namespace

std::vector<int> lora_row_adapters(const SeqBatch& batch) {
    std::vector<int> rows(static_cast<size_t>(batch.n_tok()), 0);
    if (!batch.adapter.empty())
        for (int64_t s = 0; s < batch.n_seq(); ++s)
            for (int64_t t = batch.offsets[s]; t < batch.offsets[s + 1]; ++t)
                rows[static_cast<size_t>(t)] = batch.adapter[static_cast<size_t>(s)];
    return rows;
}

LoraRows adapter_rows(const SeqBatch& batch, int n_adapters) {
    HYMOE_CHECK(
        batch.adapter.empty() || static_cast<int64_t>(batch.adapter.size()) == batch.n_seq(),
        "adapter_rows: ",
        batch.adapter.size(),
        " adapter ids for ",
        batch.n_seq(),
        " sequences");
    LoraRows out;
    add_segments(out, 0, lora_row_adapters(batch), 0, batch.n_tok(), n_adapters);
    return out;
}

LoraRows expert_adapter_rows(const std::vector<int64_t>& grouped_row,
                             int64_t k,
                             const std::vector<int>& token_adapter,
                             const std::vector<int64_t>& offset,
                             int n_adapters) {
    HYMOE_CHECK(k >= 1 &&
                    static_cast<int64_t>(grouped_row.size()) ==
                        k * static_cast<int64_t>(token_adapter.size()) &&
                    !offset.empty(),
                "expert_adapter_rows: ",
                grouped_row.size(),
                " slots for ",
                token_adapter.size(),
                " tokens of top-",
                k);
    std::vector<int> row_adapter(static_cast<size_t>(offset.back()), -1);  // [n_rows]
    for (size_t a = 0; a < grouped_row.size(); ++a)
        if (grouped_row[a] >= 0) {
            HYMOE_CHECK(grouped_row[a] < offset.back(),
                        "expert_adapter_rows: slot row ",
                        grouped_row[a],
                        " past ",
                        offset.back());
            row_adapter[static_cast<size_t>(grouped_row[a])] =
                token_adapter[a / static_cast<size_t>(k)];
        }
    LoraRows out;
    for (size_t e = 0; e + 1 < offset.size(); ++e)
        add_segments(
            out, static_cast<int64_t>(e), row_adapter, offset[e], offset[e + 1], n_adapters);
    return out;
}

}  // namespace hymoe::model
