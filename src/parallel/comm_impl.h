// The private state behind comm::Comm: the MPI communicator (owned, freed on destruction) and, in
// CUDA builds, how its device tensors travel and the NCCL communicator made from it. Also
// HYMOE_MPI_CHECK.
#pragma once

#include <string>

#include <mpi.h>

#include "hymoe/core/error.h"
#include "hymoe/parallel/comm.h"

#ifdef HYMOE_CUDA
#include <nccl.h>
#endif

namespace hymoe::comm {

struct Comm::Impl {
    MPI_Comm mpi = MPI_COMM_NULL;
    int rank = 0, size = 1;
    std::string name;
#ifdef HYMOE_CUDA
    // Decided on the first device collective (comm_stage.cu, collective over the Comm): NCCL when
    // each rank has its own GPU, else host memory and MPI.
    enum class DevicePath { undecided, nccl, host };
    DevicePath device_path = DevicePath::undecided;
    ncclComm_t nccl = nullptr;  // made lazily on the first device collective over NCCL
#endif
    Impl(MPI_Comm comm, std::string comm_name);  // takes ownership; sets MPI_ERRORS_RETURN
    ~Impl();
    Impl(const Impl&) = delete;
    Impl& operator=(const Impl&) = delete;
};

std::string mpi_error_string(int code);

}  // namespace hymoe::comm

// An MPI call that returns an error code becomes a hymoe::Error naming the call and its context.
#define HYMOE_MPI_CHECK(call, ...)                                         \
    do {                                                                   \
        int hymoe_mpi_rc_ = (call);                                        \
        if (hymoe_mpi_rc_ != MPI_SUCCESS)                                  \
            HYMOE_FAIL_ONE(::hymoe::Exit::internal,                        \
                           #call,                                          \
                           " failed (",                                    \
                           ::hymoe::comm::mpi_error_string(hymoe_mpi_rc_), \
                           "): ",                                          \
                           __VA_ARGS__);                                   \
    } while (0)
