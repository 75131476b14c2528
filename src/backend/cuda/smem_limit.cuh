// Lifts a fused kernel's dynamic shared-memory limit to kDynamicSmemLimit once per kernel per
// process (the attribute stays set; one device per process, as select_device arranges), so its
// launches make no attribute call: none on the hot path, none while a step is being captured.
#pragma once

#include "check.h"
#include "hymoe/backend/cuda_fused.h"

namespace hymoe::backend::cuda {

template <auto kernel>
void allow_dynamic_smem(const char* op) {
    static const cudaError_t rc = cudaFuncSetAttribute(
        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kDynamicSmemLimit);
    HYMOE_CUDA_CHECK(rc, op, ": a shared-memory limit of ", kDynamicSmemLimit, " bytes");
}

}  // namespace hymoe::backend::cuda
