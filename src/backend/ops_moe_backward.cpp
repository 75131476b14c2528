// The routed experts' backward ops on a Ctx (hymoe/backend/ops_moe_backward.h): each checks its
// tensors, then runs the CPU op or queues the CUDA kernel of the same name and semantics
// (src/backend/ops_switch.h).
#include "hymoe/backend/ops_moe_backward.h"

#include <cstring>

#include "hymoe/backend/cuda_model_ops.h"
#include "hymoe/backend/cuda_moe_backward.h"
#include "hymoe/backend/ops_moe.h"
#include "hymoe/core/error.h"
#include "ops_switch.h"

namespace hymoe::ops {

using namespace backend::detail;

void moe_gather_scaled(const Ctx& ctx,
                       const Tensor& x,
                       const Tensor& row,
                       const Tensor& weight,
                       int64_t k,
                       Tensor& in) {
    check_on(ctx, "moe_gather_scaled", {&x, &row, &weight, &in});
    HYMOE_CHECK(weight.dtype == DType::f32 && weight.numel() == row.numel(),
                "moe_gather_scaled: weight ",
                shape_string(weight.shape),
                " for a row map ",
                shape_string(row.shape));
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda)
            return cu::moe_gather_scaled(*ctx.stream, x, row, weight, k, in);
    moe_gather(x, row, weight.ptr<float>(), k, in);
}

void moe_slot_dot(
    const Ctx& ctx, const Tensor& g, const Tensor& out, const Tensor& row, int64_t k, Tensor& dw) {
    check_on(ctx, "moe_slot_dot", {&g, &out, &row, &dw});
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda)
            return cu::moe_slot_dot(*ctx.stream, g, out, row, k, dw);
    moe_slot_dot(g, out, row, k, dw);
}

void place_cols(const Ctx& ctx, const Tensor& src, int64_t col0, Tensor& dst) {
    check_on(ctx, "place_cols", {&src, &dst});
    HYMOE_CHECK(dst.shape.size() == 2 && !src.shape.empty(),
                "place_cols: src ",
                shape_string(src.shape),
                " dst ",
                shape_string(dst.shape));
    const int64_t n = dst.dim(0), width = dst.dim(1), w = src.dim(-1);
    HYMOE_CHECK(src.numel() == n * w && src.dtype == dst.dtype && col0 >= 0 && col0 + w <= width,
                "place_cols: ",
                shape_string(src.shape),
                " into columns [",
                col0,
                ", ",
                col0 + w,
                ") of ",
                shape_string(dst.shape));
    if (n * w == 0)
        return;
    const size_t es = dtype_size(src.dtype);
    auto* to = static_cast<unsigned char*>(dst.data) + col0 * static_cast<int64_t>(es);
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda)
            return cu::copy_2d(*ctx.stream, src.dtype, src.data, w, to, width, n, w);
    const auto* from = static_cast<const unsigned char*>(src.data);
    for (int64_t r = 0; r < n; ++r)
        std::memcpy(to + r * width * es, from + r * w * es, w * es);
}

}  // namespace hymoe::ops
