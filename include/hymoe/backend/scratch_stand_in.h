// Device scratch at fixed addresses standing in for an arena: a decode graph's workspace, whose
// captured kernels keep the addresses they were given, so that no step scratch of a captured
// step may come from the arena (where a later allocation could take it). While a stand-in is
// installed on this thread for an arena (StandInScope), every backend::Scratch of a CUDA Ctx on
// that arena takes its tensors from the stand-in and gives them back in reverse order. Plain C++
// in every build (src/backend/scratch_stand_in.cpp); no CUDA header.
#pragma once

#include "hymoe/tensor/tensor.h"

namespace hymoe::backend {

namespace cuda {
class DeviceArena;
}

class ScratchStandIn {
public:
    virtual ~ScratchStandIn() = default;
    // An uninitialised device tensor; release gives it back, last taken first.
    virtual Tensor tensor(DType dtype, Shape shape) = 0;
    virtual void release(void* p) noexcept = 0;
    // The stand-in installed on this thread for `arena`, or null.
    static ScratchStandIn* active(const cuda::DeviceArena* arena);
};

// Installs `s` for `arena` on this thread for the scope's life (scopes nest).
class StandInScope {
public:
    StandInScope(ScratchStandIn& s, const cuda::DeviceArena& arena);
    ~StandInScope();
    StandInScope(const StandInScope&) = delete;
    StandInScope& operator=(const StandInScope&) = delete;

private:
    ScratchStandIn* previous_;
    const cuda::DeviceArena* previous_arena_;
};

}  // namespace hymoe::backend
