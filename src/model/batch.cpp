// Per-row views of a SeqBatch's adapter choice (model/batch.h).
#include "hymoe/model/batch.h"

#include <cstddef>

namespace hymoe::model {

std::vector<int> row_adapters(const SeqBatch& batch) {
    std::vector<int> rows;
    if (batch.adapter.empty())
        return rows;
    rows.reserve(static_cast<std::size_t>(batch.n_tok()));
    for (int64_t s = 0; s < batch.n_seq(); ++s)
        rows.insert(rows.end(), static_cast<std::size_t>(batch.length(s)), batch.adapter[s]);
    return rows;
}

SeqBatch single_rows(const std::vector<int>& adapter) {
    SeqBatch b;
    const auto n = static_cast<int64_t>(adapter.size());
    b.offsets.resize(static_cast<std::size_t>(n + 1));
    for (int64_t i = 0; i <= n; ++i)
        b.offsets[i] = i;
    b.pos0.assign(static_cast<std::size_t>(n), 0);
    b.adapter = adapter;
    return b;
}

}  // namespace hymoe::model
