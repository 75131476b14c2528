// The expert-grouped layout of an MoE call (model/moe_experts.h): each of n rows carries k slots
// (its top-k experts, −1 where not computed here: dropped by capacity or hosted elsewhere); the
// computed (row, slot) assignments are laid out grouped by expert, expert e owning grouped rows
// [offset[e], offset[e+1]), its assignments in row order. The plan is built on the host from the
// slots' expert ids; its `row` array, uploaded to a Ctx's device, drives the gather, the grouped
// products and the combine of backend/ops_moe.h on either backend (the CUDA kernels of moe.cu
// take the same array).
#pragma once

#include <cstdint>
#include <vector>

namespace hymoe::backend {

struct MoeGroups {
    std::vector<int64_t> offset;  // [E + 1] first grouped row of each expert
    std::vector<int64_t> row;     // [n·k] grouped row of slot a, −1 where not computed
    int64_t n_rows() const { return offset.back(); }
    std::vector<int64_t> rows_per_expert() const;  // [E] offset[e + 1] − offset[e]
};

// The groups of expert [n·k] (ids in [0, E) or −1) for E experts. An id ≥ E is an internal error.
MoeGroups moe_group_rows(const int32_t* expert, int64_t n, int64_t k, int64_t n_exp);

}  // namespace hymoe::backend
