// share_device: how the ranks of one node that compute on the same GPU split its memory
// (select_device puts rank r on GPU local_rank mod the GPU count, so several ranks may share one).
// Collective over MPI_COMM_WORLD: every rank calls it at the same point, each with its own device.
// The node's ranks (MPI_COMM_TYPE_SHARED) first wait for one another, so that none has begun the
// allocations the share is for; then each reads its device's free memory and every rank's
// (device, free bytes) is gathered over the node. The device keys are taken as given (the GPU
// model's: backend::current_device_key, the same for one GPU in every process whatever its device
// number there); tests pass made-up ones, without a GPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

namespace hymoe::parallel {

struct DeviceShare {
    int sharers = 1;        // the node's ranks on this rank's device, itself included
    size_t free_bytes = 0;  // the least free memory any of them read
};

// free_bytes: reads this rank's device's free memory (backend::free_device_bytes). A throw there
// on any rank of the node throws on every rank of it (after the gather, so none is left waiting).
DeviceShare share_device(int64_t device, const std::function<size_t()>& free_bytes);

}  // namespace hymoe::parallel
