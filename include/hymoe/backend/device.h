// select_device: which GPU, if any, this rank computes on. Collective over MPI_COMM_WORLD: every
// rank calls it once at start-up, before any device memory or NCCL communicator is made (NCCL
// communicators are made on the device chosen here). The local rank comes from the ranks sharing
// this node's memory (MPI_COMM_TYPE_SHARED, ordered by world rank), in every build. CUDA is used
// only if it was asked for, this is a CUDA build and every rank sees at least one GPU (agreed
// with an MPI_Allreduce(MIN)); otherwise every rank falls back to the CPU, without an error.
// No MPI or CUDA header here.
#pragma once

#include <string>

namespace hymoe::backend {

struct DeviceInfo {
    bool cuda_available = false;  // the same on every rank: true iff all ranks compute on a GPU
    int n_devices = 0;            // GPUs this rank sees (0 when CUDA was not asked for or absent)
    int local_rank = 0;           // rank among the ranks on this node, 0..n_local-1
    int device = -1;       // CUDA device set for this rank: local_rank % n_devices; -1 on CPU
    std::string name;      // that device's name ("NVIDIA H200"); empty on CPU
    double memory_gb = 0;  // its total memory in GB (1e9 bytes); 0 on CPU
};

// Finds the local rank, and with want_cuda (CUDA builds) counts the GPUs, agrees on availability
// and calls cudaSetDevice(local_rank % n_devices). Several ranks on one GPU are allowed here, but
// NCCL refuses two ranks of one communicator on the same GPU.
DeviceInfo select_device(bool want_cuda);

}  // namespace hymoe::backend
