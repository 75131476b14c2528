// share_device (hymoe/parallel/device_share.h): a barrier over the node, one read of the free
// memory per rank, one gather of (device, free bytes, failed) over the node.
#include "hymoe/parallel/device_share.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <mpi.h>

#include "comm_impl.h"

namespace hymoe::parallel {

namespace {

// Whatever a collective over `node` throws, the communicator is freed.
struct NodeComm {
    MPI_Comm comm = MPI_COMM_NULL;
    NodeComm() {
        int world_rank = 0;
        HYMOE_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank), "share_device");
        HYMOE_MPI_CHECK(MPI_Comm_split_type(
                            MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank, MPI_INFO_NULL, &comm),
                        "share_device: the node communicator");
    }
    ~NodeComm() { MPI_Comm_free(&comm); }
    NodeComm(const NodeComm&) = delete;
    NodeComm& operator=(const NodeComm&) = delete;
};

}  // namespace

DeviceShare share_device(int64_t device, const std::function<size_t()>& free_bytes) {
    const NodeComm node;
    HYMOE_MPI_CHECK(MPI_Barrier(node.comm), "share_device: waiting for the node's ranks");
    std::string error;
    int64_t mine[3] = {device, 0, 0};  // device, free bytes, failed
    try {
        mine[1] = static_cast<int64_t>(free_bytes());
    } catch (const std::exception& e) {
        error = e.what();
        mine[2] = 1;
    }
    int n = 1;
    HYMOE_MPI_CHECK(MPI_Comm_size(node.comm, &n), "share_device: node size");
    std::vector<int64_t> all(static_cast<size_t>(3 * n));
    HYMOE_MPI_CHECK(MPI_Allgather(mine, 3, MPI_INT64_T, all.data(), 3, MPI_INT64_T, node.comm),
                    "share_device: every rank's device and free memory");
    DeviceShare share{0, static_cast<size_t>(mine[1])};
    for (int r = 0; r < n; ++r) {
        const int64_t* row = all.data() + 3 * r;
        if (row[2] != 0)  // every rank of the node throws: a node, not the world, agrees
            HYMOE_FAIL_ONE(Exit::internal,
                           "share_device: ",
                           error.empty()
                               ? cat("node rank ", r, " could not read its GPU's free memory")
                               : error);
        if (row[0] == device) {
            ++share.sharers;
            share.free_bytes = std::min(share.free_bytes, static_cast<size_t>(row[1]));
        }
    }
    return share;
}

}  // namespace hymoe::parallel
