// Owned tensors on a Ctx's device (backend/held.h).
#include "hymoe/backend/held.h"

#include <utility>

#include "hymoe/backend/cuda_arena.h"
#include "hymoe/backend/ops_rows.h"
#include "ops_switch.h"

namespace hymoe::backend {

Held::Held(const Ctx& ctx, DType dtype, Shape shape) {
    detail::check_on(ctx, "Held", {});
    if constexpr (detail::kCudaBuild)
        if (ctx.device == Device::cuda) {
            arena_ = ctx.arena;
            view_ = arena_->tensor(dtype, std::move(shape));
            ops::fill_zero(ctx, view_);
            return;
        }
    host_ = Buffer(dtype, std::move(shape));
    view_ = host_.view();
}

Held::Held(Held&& other) noexcept
    : host_(std::move(other.host_)),
      arena_(std::exchange(other.arena_, nullptr)),
      view_(std::exchange(other.view_, Tensor{})) {}

Held& Held::operator=(Held&& other) noexcept {
    if (this != &other) {
        release();
        host_ = std::move(other.host_);
        arena_ = std::exchange(other.arena_, nullptr);
        view_ = std::exchange(other.view_, Tensor{});
    }
    return *this;
}

Held::~Held() {
    release();
}

void Held::release() noexcept {
    if constexpr (detail::kCudaBuild)
        if (arena_ != nullptr && view_.data != nullptr)
            arena_->free(view_.data);
    arena_ = nullptr;
    host_ = Buffer();
    view_ = Tensor{};
}

}  // namespace hymoe::backend
