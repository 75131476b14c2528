// What an infer run's ranks held, against their plan (runtime/plan.h): per rank the weights
// (exact, from the tensor list), the KV pages at their most, the allocator's peak of every host
// Buffer (weights, KDA states, activations, logits) plus those pages, and the peak resident set
// (getrusage, which also counts the binary, MPI and BLAS); planned: the stage's weights, KV
// pages, KDA states and the larger activation set, without the plan's fixed runtime reserve
// (a GPU's CUDA context and NCCL buffers). Logged for rank 0 and written to profile.h5.
#pragma once

#include <array>
#include <string>

#include "hymoe/model/model.h"
#include "hymoe/parallel/comms.h"
#include "hymoe/runtime/job.h"

namespace hymoe::runtime {

// Bytes: weights, kv_pages, allocated (Buffer peak + KV pages), resident, then the planned
// weights, kv_pages, kda_state, activations and total.
constexpr int kMemoryColumns = 9;
using RankMemory = std::array<double, kMemoryColumns>;
extern const char* const kMemoryColumnNames;  // "weights kv_pages allocated resident ..."

RankMemory rank_memory(const Job& job, model::Model& m, int64_t peak_kv_bytes);
// One line for the log: measured against planned.
std::string memory_line(const RankMemory& r);

}  // namespace hymoe::runtime
