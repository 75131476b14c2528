// A Ctx (backend/ctx.h) together with what it points to, owned: on CUDA a stream, one arena of a
// given size that the context's work and everything its owner keeps allocates from, and a cuBLAS
// handle bound to both; on the CPU nothing (the context is cpu_ctx()). The model on a device
// (model/device_model.h) and the LoRA trainer's device weights (model/device_weights.h) each hold
// one. No CUDA header here.
// Invariants: the owner outlives every tensor, Scratch and Held made on its context.
#pragma once

#include <cstddef>
#include <memory>

#include "hymoe/backend/ctx.h"

namespace hymoe::backend {

class OwnedCtx {
public:
    // device cuda: an arena of arena_bytes on the current GPU (a CUDA build); max_groups: the
    // most GEMMs one grouped call runs (cuBLAS's pointer arrays). cpu: arena_bytes is kept as
    // capacity() (the budget a model's KV pages are cut from), nothing is allocated.
    OwnedCtx(Device device, size_t arena_bytes, int max_groups);
    ~OwnedCtx();
    OwnedCtx(const OwnedCtx&) = delete;
    OwnedCtx& operator=(const OwnedCtx&) = delete;

    const Ctx& ctx() const { return ctx_; }
    // The arena's bytes, and those in use now (CPU: arena_bytes, and 0: host memory is not
    // sub-allocated).
    size_t capacity() const;
    size_t used() const;
    // The arena's first byte (the origin of the fused KDA kernels' state slots); null on the CPU.
    char* base() const;

private:
    struct Cuda;  // CUDA: the stream, arena and handle
    std::unique_ptr<Cuda> cuda_;
    Ctx ctx_;
    size_t capacity_ = 0;
};

}  // namespace hymoe::backend
