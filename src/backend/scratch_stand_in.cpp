// The thread's scratch stand-in (hymoe/backend/scratch_stand_in.h): one installed stand-in and
// the arena it stands in for, saved and restored by each scope.
#include "hymoe/backend/scratch_stand_in.h"

namespace hymoe::backend {

namespace {

thread_local ScratchStandIn* installed = nullptr;
thread_local const cuda::DeviceArena* installed_arena = nullptr;

}  // namespace

ScratchStandIn* ScratchStandIn::active(const cuda::DeviceArena* arena) {
    return installed != nullptr && installed_arena == arena ? installed : nullptr;
}

StandInScope::StandInScope(ScratchStandIn& s, const cuda::DeviceArena& arena)
    : previous_(installed), previous_arena_(installed_arena) {
    installed = &s;
    installed_arena = &arena;
}

StandInScope::~StandInScope() {
    installed = previous_;
    installed_arena = previous_arena_;
}

}  // namespace hymoe::backend
