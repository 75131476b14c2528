// Where a CUDA context's scratch (backend::Scratch, ctx.h) comes from on this thread: the arena
// itself, or a stand-in registered for it (the GPU model's decode-graph workspace: fixed
// addresses, last-in first-out, so that a step captured as a graph and queued again gets the
// same memory). A Scratch must live inside the registration it started under.
#pragma once

#include "hymoe/tensor/tensor.h"

namespace hymoe::backend {

namespace cuda {
class DeviceArena;
}

class ScratchSource {
public:
    virtual ~ScratchSource() = default;
    virtual Tensor take(DType dtype, Shape shape) = 0;  // uninitialised device memory
    virtual void give(void* p) noexcept = 0;            // the last taken, still held
};

// The source standing in for `arena` on this thread now, or null.
ScratchSource* scratch_source(const cuda::DeviceArena* arena);
// Registers `source` for `arena` on this thread (null source: none), replacing any other.
void set_scratch_source(const cuda::DeviceArena* arena, ScratchSource* source);

}  // namespace hymoe::backend
