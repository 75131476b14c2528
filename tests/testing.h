// Helpers shared by the MPI test suite: the world size and shared verdicts (a check every rank
// agrees on, so that no rank stops early and leaves the others waiting in a collective).
#pragma once

#include <mpi.h>

namespace hymoe::testing {

inline int world_size() {
    int n = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    return n;
}

// True on every rank iff ok is true on every rank.
inline bool all_ranks(bool ok) {
    int v = ok ? 1 : 0;
    MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
    return v != 0;
}

}  // namespace hymoe::testing
