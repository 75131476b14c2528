// The execution context every backend-neutral op takes first (hymoe/backend/ops.h, "ops on a
// Ctx"): the device a call's tensors live on and, on a GPU, the stream its work is queued on, the
// cuBLAS handle its products use and the arena its scratch comes from. A CPU context carries
// nothing else. src/backend/ops.cpp holds the only switch on `device`; model blocks written against
// a Ctx run unchanged on either backend. No CUDA header here: the CUDA types are declared only.
// Invariants: every tensor of a call is on ctx.device; on CUDA, stream, arena and blas are set and
// blas is bound to stream; calls queue asynchronously on the stream (CPU: run at once).
#pragma once

#include <memory>
#include <vector>

#include "hymoe/tensor/tensor.h"

namespace hymoe::backend {

namespace cuda {
class Stream;
class DeviceArena;
class Blas;
}  // namespace cuda

struct Ctx {
    Device device = Device::cpu;
    const cuda::Stream* stream = nullptr;  // CUDA only: where the calls queue
    cuda::DeviceArena* arena = nullptr;    // CUDA only: scratch memory
    cuda::Blas* blas = nullptr;            // CUDA only: products, bound to stream
};

// A CPU context (the default: host tensors, calls run at once).
inline Ctx cpu_ctx() {
    return Ctx{};
}

// Temporary tensors on ctx's device that live until the Scratch goes out of scope (CPU: host
// Buffers; CUDA: blocks of the arena, returned in reverse order at the end). Uninitialised on
// CUDA, zero-filled on the CPU.
class Scratch {
public:
    explicit Scratch(const Ctx& ctx) : ctx_(ctx) {}
    ~Scratch();
    Scratch(const Scratch&) = delete;
    Scratch& operator=(const Scratch&) = delete;
    Tensor operator()(DType dtype, Shape shape);

private:
    const Ctx& ctx_;
    std::vector<Buffer> host_;   // CPU
    std::vector<void*> device_;  // CUDA, in allocation order
};

}  // namespace hymoe::backend
