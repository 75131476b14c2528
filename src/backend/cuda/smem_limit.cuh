// Lifts a fused kernel's dynamic shared-memory limit to kDynamicSmemLimit once per kernel per
// process (the attribute stays set; one device per process, as select_device arranges), so its
// launches make no attribute call: none on the hot path, none while a step is being captured.
#pragma once

#include <algorithm>

#include "check.h"
#include "hymoe/backend/cuda_fused.h"

namespace hymoe::backend::cuda {

// The limit asked for is kDynamicSmemLimit or, when the kernel's static shared memory leaves less,
// what it leaves of kMaxSmemPerBlock (dynamic + static may not exceed the opt-in maximum).
template <auto kernel>
void allow_dynamic_smem(const char* op) {
    static const cudaError_t rc = [] {
        cudaFuncAttributes a{};
        const cudaError_t got = cudaFuncGetAttributes(&a, kernel);
        if (got != cudaSuccess)
            return got;
        const int room = kMaxSmemPerBlock - static_cast<int>(a.sharedSizeBytes);
        return cudaFuncSetAttribute(
            kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, std::min(kDynamicSmemLimit, room));
    }();
    HYMOE_CUDA_CHECK(rc, op, ": a shared-memory limit of up to ", kDynamicSmemLimit, " bytes");
}

}  // namespace hymoe::backend::cuda
