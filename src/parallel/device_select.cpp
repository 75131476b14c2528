// select_device (hymoe/parallel/device_select.h): the node-local rank and the world's agreement on
// GPUs. Every rank reaches the same collectives in the same order whatever it finds, so none is
// left waiting.
#include "hymoe/parallel/device_select.h"

#include <mpi.h>

#include "comm_impl.h"

namespace hymoe::parallel {

namespace {

// This rank's position among the world ranks that share its node, keyed by world rank so that
// local ranks follow world order.
int node_local_rank() {
    int world_rank = 0;
    HYMOE_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank), "select_device");
    MPI_Comm node = MPI_COMM_NULL;
    HYMOE_MPI_CHECK(
        MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank, MPI_INFO_NULL, &node),
        "select_device: the node communicator");
    int local = 0;
    const int rc = MPI_Comm_rank(node, &local);
    MPI_Comm_free(&node);
    HYMOE_MPI_CHECK(rc, "select_device: rank in the node communicator");
    return local;
}

}  // namespace

backend::DeviceInfo select_device(bool want_cuda) {
    const int local_rank = node_local_rank();
    const int n_devices = backend::visible_devices(want_cuda);
    int all_have_gpu = n_devices > 0 ? 1 : 0;
    HYMOE_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &all_have_gpu, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD),
                    "select_device: GPU availability");
    return backend::open_device(local_rank, n_devices, all_have_gpu != 0);
}

}  // namespace hymoe::parallel
