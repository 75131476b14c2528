// The routed experts' computation on a set of rows one expert at a time: experts_forward, the
// per-expert forward that the layer's grouped expert stage (moe_grouped.h, run by moe.cpp) equals
// bit for bit on a CPU context (its reference in the tests), and the rows' slots that the grouped
// stages of the forward and the backward (moe_grouped_backward.h) read. Private to src/model.
// Each row carries top_k slots: the slot's expert (−1: not computed here, i.e. dropped by
// capacity or hosted on another rank) and its combine weight. The (row, slot) assignments are
// grouped by expert, rows ascending within each expert, and each expert runs once on its group
// (one GEMM batch): so LoRA dropout masks, drawn per row of a call, number an expert's rows in
// that order, the same in the forward and the backward of one set of rows. Sums over a row's
// slots run in top-k slot order in fp32, so no result depends on the order the experts ran in.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "hymoe/model/ffn.h"
#include "hymoe/tensor/tensor.h"

namespace hymoe::model::detail {

// The slots of n rows: views of [n, k] arrays.
struct RowSlots {
    const int32_t* expert = nullptr;  // [n, k] expert id, −1 where not computed
    const float* weight = nullptr;    // [n, k] combine weight
    int64_t n = 0, k = 0;
    const int* adapter = nullptr;  // [n] each row's LoRA adapter id (inference's per-request
                                   //   choice); null: adapter 0 on every row
};

// out [n, w] = Σ over each row's slots (slot order) of weight · Expert(in row). poll() runs after
// each expert (to progress requests in flight); tokens_per_expert [E] += rows each expert ran on.
void experts_forward(const MoeWeights& w,
                     ExpertAct act,
                     const RowSlots& slots,
                     const Tensor& in,  // [n, w]
                     Tensor& out,       // [n, w]
                     const std::function<void()>& poll,
                     std::vector<int64_t>& tokens_per_expert);

}  // namespace hymoe::model::detail
