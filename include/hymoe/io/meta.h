// /meta, written into every HDF5 output: the deck as given and resolved, its sha256, the build
// (git sha, compiler, flags, backend, MPI), the grid, the model config, and the Slurm job if any.
#pragma once

#include <string>

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

}  // namespace hymoe::io
