// A Ctx with its stream, arena and cuBLAS handle owned (backend/owned_ctx.h).
#include "hymoe/backend/owned_ctx.h"

#include "hymoe/core/error.h"

#ifdef HYMOE_CUDA
#include "hymoe/backend/cuda_arena.h"
#include "hymoe/backend/cuda_gemm.h"
#endif

namespace hymoe::backend {

#ifdef HYMOE_CUDA
// Destroyed in reverse: the handle gives its workspace back to the arena before the arena goes.
struct OwnedCtx::Cuda {
    cuda::Stream stream;
    cuda::DeviceArena arena;
    cuda::Blas blas;
    Cuda(size_t arena_bytes, int max_groups)
        : arena(arena_bytes), blas(stream, arena, max_groups) {}
};
#else
struct OwnedCtx::Cuda {};
#endif

OwnedCtx::OwnedCtx(Device device, size_t arena_bytes, int max_groups) : capacity_(arena_bytes) {
    if (device == Device::cpu)
        return;
#ifdef HYMOE_CUDA
    cuda_ = std::make_unique<Cuda>(arena_bytes, max_groups);
    ctx_ = Ctx{Device::cuda, &cuda_->stream, &cuda_->arena, &cuda_->blas};
#else
    (void)max_groups;
    HYMOE_FAIL_ONE(Exit::internal, "a CUDA device in a build without CUDA (make CUDA=1)");
#endif
}

OwnedCtx::~OwnedCtx() = default;

size_t OwnedCtx::capacity() const {
#ifdef HYMOE_CUDA
    if (cuda_)
        return cuda_->arena.book().capacity();
#endif
    return capacity_;
}

size_t OwnedCtx::used() const {
#ifdef HYMOE_CUDA
    if (cuda_)
        return cuda_->arena.book().used();
#endif
    return 0;
}

char* OwnedCtx::base() const {
#ifdef HYMOE_CUDA
    if (cuda_)
        return cuda_->arena.base();
#endif
    return nullptr;
}

}  // namespace hymoe::backend
