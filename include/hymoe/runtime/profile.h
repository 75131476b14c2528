// The per-layer profile of an inference run (profile.layers: true): wall seconds per layer in the
// mixer (KDA or MLA/DSA, with the DSA indexer's share) and the FFN (dense or MoE), summed over
// every forward step, as a table in the log (LAMMPS-style) and in profile.h5. One rank for now;
// min/avg/max over ranks come with the parallel runtime.
#pragma once

#include <string>

#include "hymoe/model/model.h"
#include "hymoe/parallel/comms.h"
#include "hymoe/runtime/job.h"

namespace hymoe::runtime {

// The log table: one row per layer (mixer, seconds, FFN, seconds, share of the layer total).
std::string profile_table(const model::ModelConfig& cfg, const model::ForwardStats& stats);

// profile.h5 (atomic): /meta, /layers/{mixer,ffn} [n_layer] str, /layers/{mixer,ffn}_seconds
// [n_layer], /attention/{indexer,other}_seconds, /head_seconds (seconds, f32, attr unit "s").
void write_profile(const Job& job, const parallel::Grid& grid, const model::ForwardStats& stats);

}  // namespace hymoe::runtime
