// visible_devices, open_device, current_device, free_device_bytes and device_multiprocessors
// (hymoe/backend/device.h).
// Plain C++ in every build; the CUDA calls (CUDA builds only) sit behind cuda/device_api.h.
#include "hymoe/backend/device.h"

#ifdef HYMOE_CUDA
#include "cuda/device_api.h"
#endif

namespace hymoe::backend {

int visible_devices([[maybe_unused]] bool want_cuda) {
#ifdef HYMOE_CUDA
    if (want_cuda)
        return cuda::device_count();
#endif
    return 0;
}

DeviceInfo open_device(int local_rank, int n_devices, bool all_have_gpu) {
    DeviceInfo info;
    info.local_rank = local_rank;
    info.n_devices = n_devices;
    if (!all_have_gpu || n_devices <= 0)
        return info;  // CPU on every rank (always, in a CPU build)
#ifdef HYMOE_CUDA
    info.cuda_available = true;
    info.device = local_rank % n_devices;
    cuda::set_device(info.device);
    info.name = cuda::device_name(info.device);
    info.memory_gb = cuda::device_memory_gb(info.device);
#endif
    return info;
}

int current_device() {
#ifdef HYMOE_CUDA
    return cuda::current_device();
#else
    return -1;
#endif
}

int64_t current_device_key() {
#ifdef HYMOE_CUDA
    return cuda::current_device_key();
#else
    return -1;
#endif
}

size_t free_device_bytes() {
#ifdef HYMOE_CUDA
    return cuda::free_bytes();
#else
    return 0;
#endif
}

int device_multiprocessors() {
#ifdef HYMOE_CUDA
    return cuda::device_sm_count();
#else
    return 0;
#endif
}

}  // namespace hymoe::backend
