// Where a job computes: the deck's job.device (auto | cpu | cuda) against what this build, the
// job and the machine allow. Decided once, before the job's output folder is made, for the kinds
// that run the model (infer, lora). The GPU runs infer jobs (model/device_model.h) and lora jobs
// (model/train.h on model/device_weights.h) at every layout the CPU runs, expert rebalancing at
// ep > 1 included, with every inference option (adapters, KV offload host or file, the prefix
// cache, batch_invariant). `cuda` that cannot be had is an invalid deck
// (exit 2, one sentence naming job.device's place in the deck); `auto` then runs on the CPU and
// logs one line saying why. Each rank takes GPU local_rank mod the GPUs it sees (backend/device.h);
// the ranks that share one split job.device_memory of its free memory evenly (device_arena_bytes).
#pragma once

#include <cstddef>
#include <optional>
#include <string>

#include "hymoe/deck/deck.h"
#include "hymoe/runtime/job.h"

namespace hymoe::runtime {

// Why the job cannot run on a GPU whatever the machine has: the reason, phrased to follow
// "cuda, but " or "the CPU, because ".
std::optional<std::string> device_limit(const Job& job, bool cuda_build);

struct DeviceDecision {
    bool cuda = false;  // the model runs on this rank's GPU
    std::string note;   // the log line: the CPU fallback of auto and why, or the GPU taken
};

// The decision from job.device, the job's limit and whether every rank sees a GPU. Throws
// Exit::invalid (collective: every rank decides alike) when cuda was asked for and cannot be had.
DeviceDecision decide_device(const deck::Deck& deck,
                             const std::optional<std::string>& limit,
                             bool gpu_on_every_rank);

// Collective over the world: device_limit, then (when a GPU may be used) backend::select_device,
// which sets this rank's GPU, then decide_device; logs the note.
DeviceDecision choose_device(const Job& job);

// The bytes of a GPU's free memory that one rank's arena takes: `fraction` (job.device_memory) of
// free_bytes, divided evenly among the `sharers` ranks that compute on that GPU.
size_t arena_share(size_t free_bytes, double fraction, int sharers);

// This rank's arena on its GPU (the GPU model's and the GPU trainer's): arena_share of the least
// free memory the ranks sharing the GPU read, among that many (parallel::share_device on the
// current device). Collective over the world, once, before the first allocation of an arena;
// logs one line (rank 0's share) when ranks share a GPU.
size_t device_arena_bytes(const Job& job);

}  // namespace hymoe::runtime
