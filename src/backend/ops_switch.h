// The device switch's shared pieces for src/backend/ops*.cpp (private): whether this is a CUDA
// build, and the check every op on a Ctx makes first (its tensors on ctx's device; a CUDA context
// complete, and only in a CUDA build).
#pragma once

#include <initializer_list>

#include "hymoe/backend/ctx.h"
#include "hymoe/core/error.h"
#include "hymoe/tensor/tensor.h"

namespace hymoe::backend::detail {

#ifdef HYMOE_CUDA
constexpr bool kCudaBuild = true;
#else
constexpr bool kCudaBuild = false;
#endif

namespace cu = backend::cuda;

// Every tensor of a call on ctx's device; a CUDA context complete, and only in a CUDA build.
inline void check_on(const backend::Ctx& ctx,
                     const char* op,
                     std::initializer_list<const Tensor*> ts) {
    for (const Tensor* t : ts)
        HYMOE_CHECK(t->device == ctx.device || t->data == nullptr,
                    op,
                    ": a ",
                    to_string(t->device),
                    " tensor on a ",
                    to_string(ctx.device),
                    " context");
    if (ctx.device == Device::cuda) {
        HYMOE_CHECK(kCudaBuild, op, ": a CUDA context in a build without CUDA (make CUDA=1)");
        HYMOE_CHECK(ctx.stream != nullptr && ctx.arena != nullptr && ctx.blas != nullptr,
                    op,
                    ": a CUDA context without its stream, arena and BLAS handle");
    }
}

}  // namespace hymoe::backend::detail
