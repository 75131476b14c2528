// A packed batch of sequences, the unit every block's forward takes. The tokens of sequence s are
// rows [offsets[s], offsets[s+1]) of every activation tensor ([n_tok, ...], no padding); pos0[s]
// is the position of its first row: 0 for a new prompt, > 0 when a prefill chunk or a decode step
// continues a sequence whose state (KDA) or cache (MLA/DSA) already holds pos0[s] tokens.
// States and caches are per sequence and are passed in the same order as the sequences.
#pragma once

#include <cstdint>
#include <vector>

namespace hymoe::model {

struct SeqBatch {
    std::vector<int64_t> offsets;  // [n_seq + 1], offsets[0] = 0, increasing
    std::vector<int64_t> pos0;     // [n_seq]
    std::vector<int> adapter;      // [n_seq] LoRA adapter id per sequence (model/lora.h), −1
                                   //   none; empty: adapter 0 for every sequence

    int64_t n_seq() const { return static_cast<int64_t>(pos0.size()); }
    int64_t n_tok() const { return offsets.empty() ? 0 : offsets.back(); }
    int64_t length(int64_t s) const { return offsets[s + 1] - offsets[s]; }
};

// One sequence of n tokens starting at position pos0.
inline SeqBatch single_sequence(int64_t n, int64_t pos0 = 0) {
    return SeqBatch{{0, n}, {pos0}, {}};
}

// The adapter id of every row of `batch` ([n_tok]; empty when batch.adapter is empty).
std::vector<int> row_adapters(const SeqBatch& batch);

// Rows that each carry their own adapter: one single-row sequence per entry of adapter
// ([n_rows] ids), for adapted projections over gathered rows (the routed experts).
SeqBatch single_rows(const std::vector<int>& adapter);

}  // namespace hymoe::model
