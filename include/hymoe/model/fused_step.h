// The GPU model's use of the fused kernels (hymoe/backend/cuda_fused.h), host side: whether a
// step's DSA attention runs fused and with which plans, and the device bytes the fused blocks
// allocate in a step (DeviceModelOn::step_bytes). Plain C++ in every build, so the choices are
// unit-tested on the CPU (tests/unit/model/test_fused_step.cpp).
#pragma once

#include <cstdint>

#include "hymoe/backend/cuda_fused.h"
#include "hymoe/model/config.h"

namespace hymoe::model {

// A step's fused DSA attention: one indexer_topk over every row of the step (each row ranks its
// visible keys, its position + 1), then one mla_sparse over the top_k selected rows.
struct DsaFusedPlan {
    bool supported = false;
    const char* why = nullptr;  // when not supported
    int top_k = 0;              // selected keys a row: min(cfg.indexer.top_k, max_visible)
    backend::cuda::IndexerPlan indexer;
    backend::cuda::MlaSparsePlan attention;
};
// The plans for n_rows rows whose visible keys number at most max_visible, on a device of n_sm
// SMs; one_sequence: every row is of one sequence (the indexer then ranks two queries a block).
DsaFusedPlan dsa_fused_plan(
    const ModelConfig& cfg, int64_t n_rows, int64_t max_visible, bool one_sequence, int n_sm);

// Bytes the fused DSA path allocates for a step of up to max_tokens rows: the selection
// idx [max_tokens, top_k] int32 and the most indexer scratch any plan of up to max_tokens rows
// takes (its key splits' candidates).
int64_t dsa_fused_bytes(const ModelConfig& cfg, int64_t max_tokens, int n_sm);

// The most bytes the fused MoE path allocates for a step of up to max_tokens rows, over the
// model's MoE layer kinds: the dispatch plan's scratch, h [n·k, I] and out [n·k, w] bf16, and the
// routing's idx [n, k] int32 and weights [n, k] fp32. 0 when no MoE layer runs fused
// (model/moe_parallel.h moe_runs_fused, the predicate the layer itself asks).
int64_t moe_fused_bytes(const ModelConfig& cfg, int64_t max_tokens);

}  // namespace hymoe::model
