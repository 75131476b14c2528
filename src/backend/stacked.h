// The check that a grouped call's expert matrices are the consecutive slices of one stacked
// tensor, for the ops that hand the stack to one CUDA kernel (src/backend/ops_moe.cpp
// grouped_linear, ops_moe_fused.cpp moe_fused_experts). Private to src/backend.
#pragma once

#include <cstdint>
#include <vector>

#include "hymoe/backend/ctx.h"
#include "hymoe/core/error.h"
#include "hymoe/tensor/tensor.h"
#include "ops_switch.h"

namespace hymoe::backend::detail {

// w [E] of [rows, cols] as the one stacked [E, rows, cols] tensor (w's dtype, on ctx's device)
// whose consecutive slices they are: w[e] of w[0]'s shape and dtype at w[0].data + e·bytes.
// Otherwise an error naming op, `what` (e.g. "gate matrix") and the first expert that is not.
inline Tensor stacked_slices(const Ctx& ctx,
                             const std::vector<Tensor>& w,
                             const char* op,
                             const char* what) {
    HYMOE_CHECK(!w.empty() && w.front().data != nullptr, op, ": no ", what);
    const Tensor& first = w.front();
    check_on(ctx, op, {&first});
    const auto stride = static_cast<int64_t>(first.bytes());
    for (size_t e = 0; e < w.size(); ++e)
        HYMOE_CHECK(
            w[e].data == static_cast<const char*>(first.data) + static_cast<int64_t>(e) * stride &&
                w[e].shape == first.shape && w[e].dtype == first.dtype,
            op,
            ": expert ",
            e,
            "'s ",
            what,
            " is not slice ",
            e,
            " of one stacked tensor");
    return Tensor{first.data,
                  first.dtype,
                  first.device,
                  {static_cast<int64_t>(w.size()), first.dim(0), first.dim(1)}};
}

}  // namespace hymoe::backend::detail
