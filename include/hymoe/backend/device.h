// The device a rank computes on, found in two local steps around one agreement that the parallel
// layer makes (parallel/device_select.h: select_device): visible_devices counts this process's
// GPUs, open_device sets and describes the chosen one; current_device and free_device_bytes tell
// it and its free memory later. CUDA is used only if it was asked for, this is a CUDA build and
// every rank sees at least one GPU; otherwise every rank stays on the CPU, without an error. No MPI
// or CUDA header here, and no collective.
#pragma once

#include <cstddef>
#include <cstdint>
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

// GPUs this process sees when want_cuda (0 in a CPU build, without a driver, or when not asked).
int visible_devices(bool want_cuda);

// The device of the rank at `local_rank` on its node that sees n_devices GPUs: with all_have_gpu
// (every rank of the world sees one) cudaSetDevice(local_rank % n_devices) and its description;
// otherwise the CPU. Several ranks on one GPU are allowed here, but NCCL refuses two ranks of one
// communicator on the same GPU.
DeviceInfo open_device(int local_rank, int n_devices, bool all_have_gpu);

// The GPU this process computes on (the one open_device set): -1 in a CPU build.
int current_device();
// That GPU's identity across processes (a hash of its PCI bus id, ≥ 0), the same in every process
// of the node that computes on it whatever device number it has there (CUDA_VISIBLE_DEVICES,
// one GPU per task): -1 in a CPU build.
int64_t current_device_key();
// Its free memory in bytes (other processes' and this one's allocations taken): 0 in a CPU build.
size_t free_device_bytes();
// Its streaming multiprocessors (the fused kernels' plans size grids by them): 0 in a CPU build.
int device_multiprocessors();

}  // namespace hymoe::backend
