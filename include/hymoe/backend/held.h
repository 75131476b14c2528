// A tensor that owns its memory on a Ctx's device, for what outlives a Scratch's last-in
// first-out scope (a training pass's residual stream kept from the forward to the backward, the
// adapters' factors): a host Buffer on the CPU, a block of the context's arena on CUDA, given
// back when the Held goes. Zero-filled on creation (CUDA: queued on the context's stream). The
// free does not wait for the GPU: as with Scratch, memory is reused only by work queued after
// every use of it (one stream).
#pragma once

#include "hymoe/backend/ctx.h"
#include "hymoe/tensor/tensor.h"

namespace hymoe::backend {

class Held {
public:
    Held() = default;
    Held(const Ctx& ctx, DType dtype, Shape shape);
    Held(Held&& other) noexcept;
    Held& operator=(Held&& other) noexcept;
    ~Held();
    Held(const Held&) = delete;
    Held& operator=(const Held&) = delete;
    Tensor& view() { return view_; }
    const Tensor& view() const { return view_; }

private:
    void release() noexcept;
    Buffer host_;                         // CPU
    cuda::DeviceArena* arena_ = nullptr;  // CUDA: the arena the block came from
    Tensor view_;
};

}  // namespace hymoe::backend
