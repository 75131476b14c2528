// The per-thread stand-in for a CUDA arena's scratch (backend/scratch_source.h).
#include "hymoe/backend/scratch_source.h"

namespace hymoe::backend {

namespace {

thread_local const cuda::DeviceArena* source_arena = nullptr;
thread_local ScratchSource* source = nullptr;

}  // namespace

ScratchSource* scratch_source(const cuda::DeviceArena* arena) {
    return arena != nullptr && arena == source_arena ? source : nullptr;
}

void set_scratch_source(const cuda::DeviceArena* arena, ScratchSource* s) {
    source_arena = s != nullptr ? arena : nullptr;
    source = s;
}

}  // namespace hymoe::backend
