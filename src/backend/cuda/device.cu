// The CUDA runtime side of select_device: count, set and describe devices, and the current
// device's free memory. device_count() turns
// any error into "no GPU": without the NVIDIA driver cudaGetDeviceCount returns
// cudaErrorInsufficientDriver (the stub libcuda is never loaded), which is a CPU machine, not a
// failure. The other calls run only on a device that was counted, and throw on error.
#include <cuda_runtime.h>

#include "check.h"
#include "device_api.h"

namespace hymoe::backend::cuda {

int device_count() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();  // clear it, so that no later call reports it as its own
        return 0;
    }
    return n;
}

void set_device(int device) {
    HYMOE_CUDA_CHECK(cudaSetDevice(device), "device ", device);
}

std::string device_name(int device) {
    cudaDeviceProp prop{};
    HYMOE_CUDA_CHECK(cudaGetDeviceProperties(&prop, device), "name of device ", device);
    return prop.name;
}

double device_memory_gb(int device) {
    cudaDeviceProp prop{};
    HYMOE_CUDA_CHECK(cudaGetDeviceProperties(&prop, device), "memory of device ", device);
    return static_cast<double>(prop.totalGlobalMem) / 1e9;
}

int current_device() {
    int device = -1;
    HYMOE_CUDA_CHECK(cudaGetDevice(&device), "current device");
    return device;
}

int64_t current_device_key() {
    char bus[32] = {};
    HYMOE_CUDA_CHECK(cudaDeviceGetPCIBusId(bus, static_cast<int>(sizeof bus), current_device()),
                     "PCI bus id of the current device");
    uint64_t h = 14695981039346656037ull;  // FNV-1a, 64 bits
    for (const char* c = bus; *c != 0; ++c)
        h = (h ^ static_cast<unsigned char>(*c)) * 1099511628211ull;
    return static_cast<int64_t>(h >> 1);
}

size_t free_bytes() {
    size_t free = 0, total = 0;
    HYMOE_CUDA_CHECK(cudaMemGetInfo(&free, &total), "free memory of the current device");
    return free;
}

}  // namespace hymoe::backend::cuda
