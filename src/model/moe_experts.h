// The rows' slots of a routed-expert call, read by the grouped expert stages of the forward
// (moe_grouped.h) and the backward (moe_grouped_backward.h). Private to src/model.
// Each row carries top_k slots: the slot's expert (−1: not computed here, i.e. dropped by
// capacity or hosted on another rank) and its combine weight. The (row, slot) assignments are
// grouped by expert, rows ascending within each expert, and each expert runs once on its group
// (one GEMM batch): so LoRA dropout masks, drawn per row of a call, number an expert's rows in
// that order, the same in the forward and the backward of one set of rows. Sums over a row's
// slots run in top-k slot order in fp32, so no result depends on the order the experts ran in.
#pragma once

#include <cstdint>

namespace hymoe::model::detail {

// The slots of n rows: views of [n, k] arrays.
struct RowSlots {
    const int32_t* expert = nullptr;  // [n, k] expert id, −1 where not computed
    const float* weight = nullptr;    // [n, k] combine weight
    int64_t n = 0, k = 0;
    const int* adapter = nullptr;  // [n] each row's LoRA adapter id (inference's per-request
                                   //   choice); null: adapter 0 on every row
};

}  // namespace hymoe::model::detail
