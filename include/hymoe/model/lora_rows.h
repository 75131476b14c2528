// The host side of LoRA adapters on the GPU model (model/device_model.h): which rows of a step each
// adapter adds to, as flat index lists, so that the device runs one pair of GEMMs per (adapter,
// projection) on the gathered rows instead of one per run of sequences. The choice is lora.h's:
// sequence s uses batch.adapter[s] (an empty list: adapter 0 for every sequence), and an id
// outside [0, n_adapters) (−1: the base model) adds nothing. Routed experts: the rows of an
// expert-grouped buffer (model/moe.cpp's dispatch: expert e owns rows [offset[e], offset[e+1]))
// per (expert, adapter). Plain C++ in every build (src/model/lora_rows.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include "hymoe/model/batch.h"

namespace hymoe::model {

// rows[begin, begin + count) are the rows of `adapter` in `group` (an expert; 0 for a step's
// rows), ascending.
struct LoraSegment {
    int64_t group = 0;
    int adapter = 0;
    int64_t begin = 0, count = 0;
};

// Index lists, segments ordered by group, then adapter; no empty segment.
struct LoraRows {
    std::vector<int64_t> rows;
    std::vector<LoraSegment> segments;
};

// The adapter of every row of batch [n_tok] as lora.h chooses it (empty batch.adapter: 0).
std::vector<int> lora_row_adapters(const SeqBatch& batch);

// The rows of each adapter in [0, n_adapters) that batch uses (group 0).
LoraRows adapter_rows(const SeqBatch& batch, int n_adapters);

// The rows of an expert-grouped buffer per (expert, adapter in [0, n_adapters)): grouped_row
// [n_tok·k] gives slot a's row in the buffer (−1: dropped), slot a belonging to token a / k, whose
// adapter is token_adapter[a / k]; offset [E + 1] the experts' row ranges.
LoraRows expert_adapter_rows(const std::vector<int64_t>& grouped_row,
                             int64_t k,
                             const std::vector<int>& token_adapter,
                             const std::vector<int64_t>& offset,
                             int n_adapters);

}  // namespace hymoe::model
