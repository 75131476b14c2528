// HYMOE_CUDA_CHECK, HYMOE_CUBLAS_CHECK and HYMOE_NCCL_CHECK: a CUDA runtime, cuBLAS or NCCL call
// whose return code is not success becomes a one-rank hymoe::Error (Exit::internal) naming the
// call, the library's own error string and the caller's context. CUDA builds only (.cu files and
// CUDA-only host code).
#pragma once

#include <string>

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include "hymoe/core/error.h"

namespace hymoe::backend::cuda {

// ncclGetErrorString's generic text plus NCCL's last detailed message on this thread, if any
// ("invalid usage" alone does not say which argument was wrong).
inline std::string nccl_error_text(ncclResult_t rc) {
    std::string text = ncclGetErrorString(rc);
    const char* detail = ncclGetLastError(nullptr);
    if (detail != nullptr && detail[0] != '\0')
        text += std::string("; ") + detail;
    return text;
}

}  // namespace hymoe::backend::cuda

#define HYMOE_CUDA_CHECK(call, ...)                            \
    do {                                                       \
        cudaError_t hymoe_cuda_rc_ = (call);                   \
        if (hymoe_cuda_rc_ != cudaSuccess)                     \
            HYMOE_FAIL_ONE(::hymoe::Exit::internal,            \
                           #call,                              \
                           " failed (",                        \
                           cudaGetErrorString(hymoe_cuda_rc_), \
                           "): ",                              \
                           __VA_ARGS__);                       \
    } while (0)

#define HYMOE_NCCL_CHECK(call, ...)                                                 \
    do {                                                                            \
        ncclResult_t hymoe_nccl_rc_ = (call);                                       \
        if (hymoe_nccl_rc_ != ncclSuccess)                                          \
            HYMOE_FAIL_ONE(::hymoe::Exit::internal,                                 \
                           #call,                                                   \
                           " failed (",                                             \
                           ::hymoe::backend::cuda::nccl_error_text(hymoe_nccl_rc_), \
                           "): ",                                                   \
                           __VA_ARGS__);                                            \
    } while (0)

#define HYMOE_CUBLAS_CHECK(call, ...)                               \
    do {                                                            \
        cublasStatus_t hymoe_cublas_rc_ = (call);                   \
        if (hymoe_cublas_rc_ != CUBLAS_STATUS_SUCCESS)              \
            HYMOE_FAIL_ONE(::hymoe::Exit::internal,                 \
                           #call,                                   \
                           " failed (",                             \
                           cublasGetStatusString(hymoe_cublas_rc_), \
                           "): ",                                   \
                           __VA_ARGS__);                            \
    } while (0)
