// The MPI environment of the process (MPI_Init_thread / MPI_Finalize as RAII) and the few
// world-level calls main() needs, without exposing MPI types.
#pragma once

#include <string>

namespace hymoe::parallel {

class MpiEnv {
public:
    MpiEnv(int* argc, char*** argv);
    ~MpiEnv();
    MpiEnv(const MpiEnv&) = delete;
    MpiEnv& operator=(const MpiEnv&) = delete;
};

int world_rank();
int world_size();
// Ends every rank of the world with this exit code (for errors only one rank saw).
[[noreturn]] void abort_world(int code);
// The root rank's bytes on every rank.
std::string broadcast_bytes(const std::string& bytes, int root = 0);
// The lowest rank where failed is true (world size when none); collective.
int first_failed_rank(bool failed);
// True on every rank iff ok on every rank.
bool all_ranks(bool ok);
// The MPI library version line.
std::string mpi_version();

}  // namespace hymoe::parallel
