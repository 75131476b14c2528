// ops::dropout_rows on a Ctx (backend/ops_dropout.h): the device switch.
#include "hymoe/backend/ops_dropout.h"

#include "hymoe/backend/cuda_dropout.h"
#include "ops_switch.h"

namespace hymoe::ops {

using namespace backend::detail;

void dropout_rows(const backend::Ctx& ctx, const Tensor& x, const DropoutKey& key, Tensor& y) {
    check_on(ctx, "dropout_rows", {&x, &y});
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda) {
            check_dropout_rows(x, key, y);
            return cu::dropout_rows(*ctx.stream, x, key, y);
        }
    dropout_rows(x, key, y);
}

}  // namespace hymoe::ops
