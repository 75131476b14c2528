// select_device (hymoe/backend/device.h). Plain C++ in every build: the local rank comes from
// MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) on the world, keyed by world rank so that local ranks
// follow world order; the CUDA calls (CUDA builds only) sit behind cuda/device_api.h. Every rank
// reaches the same collectives in the same order whatever it finds, so none is left waiting.
#include "hymoe/backend/device.h"

#include <string>

#include <mpi.h>

#include "hymoe/core/error.h"
#ifdef HYMOE_CUDA
#include "cuda/device_api.h"
#endif

namespace hymoe::backend {

namespace {

void mpi_check(int rc, const char* what) {
    if (rc == MPI_SUCCESS)
        return;
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, text, &len);
    HYMOE_FAIL_ONE(Exit::internal,
                   what,
                   " failed (",
                   std::string(text, static_cast<size_t>(len)),
                   "): select_device");
}

// This rank's position among the world ranks that share its node.
int node_local_rank() {
    int world_rank = 0;
    mpi_check(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank), "MPI_Comm_rank");
    MPI_Comm node = MPI_COMM_NULL;
    mpi_check(
        MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank, MPI_INFO_NULL, &node),
        "MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)");
    int local = 0;
    const int rc = MPI_Comm_rank(node, &local);
    MPI_Comm_free(&node);
    mpi_check(rc, "MPI_Comm_rank of the node communicator");
    return local;
}

}  // namespace

DeviceInfo select_device([[maybe_unused]] bool want_cuda) {
    DeviceInfo info;
    info.local_rank = node_local_rank();
#ifdef HYMOE_CUDA
    if (want_cuda)
        info.n_devices = cuda::device_count();
#endif
    int all_have_gpu = info.n_devices > 0 ? 1 : 0;
    mpi_check(MPI_Allreduce(MPI_IN_PLACE, &all_have_gpu, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD),
              "MPI_Allreduce(MIN) of GPU availability");
    if (all_have_gpu == 0)
        return info;  // CPU on every rank (always, in a CPU build)
#ifdef HYMOE_CUDA
    info.cuda_available = true;
    info.device = info.local_rank % info.n_devices;
    cuda::set_device(info.device);
    info.name = cuda::device_name(info.device);
    info.memory_gb = cuda::device_memory_gb(info.device);
#endif
    return info;
}

}  // namespace hymoe::backend
