// select_device: which GPU, if any, this rank computes on. Collective over MPI_COMM_WORLD: every
// rank calls it once at start-up, before any device memory or NCCL communicator is made (NCCL
// communicators are made on the device chosen here). The local rank comes from the ranks sharing
// this node's memory (MPI_COMM_TYPE_SHARED, ordered by world rank), in every build; the ranks
// agree on GPU availability with an MPI_Allreduce(MIN), then backend::open_device sets the device.
#pragma once

#include "hymoe/backend/device.h"

namespace hymoe::parallel {

backend::DeviceInfo select_device(bool want_cuda);

}  // namespace hymoe::parallel
