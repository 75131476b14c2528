// What an infer run's ranks held, against their plan (runtime/plan.h): per rank the weights
// (exact, from the tensor list at each tensor's storage dtype), the KV pages at their most, the
// allocator's peak of every host Buffer (weights, KDA states, activations, logits) plus those
// pages, and the peak resident set (getrusage, which also counts the binary, MPI and BLAS);
// planned: the stage's weights, KV pages, KDA states and the larger activation set, without the
// plan's fixed runtime reserve (a GPU's CUDA context and NCCL buffers). The KV pages are counted
// twice: all of them at their most (kv_pages, what the plan's KV pages are), and what the rank held
// of them in memory at most (kv_resident: the same without offload; with kv_cache.offload: file,
// the spill tier's two layer slots; on the GPU none, or with offload: host every page's pinned host
// memory), which is what `allocated` counts. Logged for rank 0 and written to profile.h5.
#pragma once

#include <array>
#include <string>

#include "hymoe/model/model.h"
#include "hymoe/parallel/comms.h"
#include "hymoe/runtime/job.h"

namespace hymoe::runtime {

// Bytes: weights, kv_pages, allocated (Buffer peak + resident KV), resident, then the planned
// weights, kv_pages, kda_state, activations and total; then kv_resident.
constexpr int kMemoryColumns = 10;
using RankMemory = std::array<double, kMemoryColumns>;
extern const char* const kMemoryColumnNames;  // "weights kv_pages allocated resident ..."

RankMemory rank_memory(const Job& job,
                       model::Model& m,
                       int64_t peak_kv_bytes,
                       int64_t resident_kv_bytes);
// One line for the log: measured against planned.
std::string memory_line(const RankMemory& r);

}  // namespace hymoe::runtime
