// /meta, written into every HDF5 output: the deck as given and resolved, its sha256, the build
// (git sha, compiler, flags, backend, MPI), the grid, the model config, and the Slurm job if any.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "hymoe/deck/deck.h"
#include "hymoe/io/h5.h"
#include "hymoe/parallel/grid.h"

namespace hymoe::io {

struct RunMeta {
    const deck::Deck* deck = nullptr;
    parallel::Layout layout;
    std::string model_summary;  // ModelConfig description for people
    std::string started_utc;
};

void write_meta(H5Writer& file, const RunMeta& meta);

// The Slurm job this process runs in, as (name, value) pairs for /meta/slurm/<name>: job_id,
// array_job_id, array_task_id, job_nodelist, ntasks, restart_count from the SLURM_* variables of
// the same names; a variable that is not set gives no pair (outside Slurm: none).
std::vector<std::pair<std::string, std::string>> slurm_env();

}  // namespace hymoe::io
