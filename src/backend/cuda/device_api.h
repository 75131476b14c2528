// The CUDA runtime calls behind select_device (src/backend/cuda/device.cu), declared without any
// CUDA header so that src/backend/device.cpp, compiled by mpicxx, calls them (#ifdef HYMOE_CUDA).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace hymoe::backend::cuda {

int device_count();                   // GPUs visible; 0 on any error (no driver, no GPU): no throw
void set_device(int device);          // cudaSetDevice
std::string device_name(int device);  // "NVIDIA H200"
double device_memory_gb(int device);  // total global memory, GB = 1e9 bytes
int current_device();                 // cudaGetDevice
int64_t current_device_key();         // FNV-1a of its cudaDeviceGetPCIBusId, as a non-negative int
size_t free_bytes();                  // the current device's free memory (cudaMemGetInfo)
int device_sm_count();                // its streaming multiprocessors (model_ops.cu)

}  // namespace hymoe::backend::cuda
