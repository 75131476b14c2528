// ops::embed_rows and ops::top_logits on a Ctx (backend/ops_head.h): the checks and the device
// switch.
#include "hymoe/backend/ops_head.h"

#include <algorithm>

#include "hymoe/backend/cuda_ops.h"
#include "hymoe/backend/ops_rows.h"
#include "ops_switch.h"

namespace hymoe::ops {

using namespace backend::detail;

void embed_rows(
    const backend::Ctx& ctx, const Tensor& table, const Tensor& tokens, int64_t lo, Tensor& h) {
    check_on(ctx, "embed_rows", {&table, &tokens, &h});
    HYMOE_CHECK(h.dtype == DType::f32, "embed_rows: h of ", to_string(h.dtype), " (f32)");
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda) {
            if (table.dtype == DType::f32)
                return cu::embed_rows(*ctx.stream, table, tokens, lo, h);
            backend::Scratch s(ctx);
            Tensor rows = s(table.dtype, h.shape);  // [n, d] in the table's dtype
            cu::embed_rows(*ctx.stream, table, tokens, lo, rows);
            return cast(ctx, rows, h);
        }
    embed_rows(table, tokens, lo, h);
}

void top_logits(
    const backend::Ctx& ctx, const Tensor& logits, Tensor& idx, Tensor& values, Tensor& log_sum) {
    check_on(ctx, "top_logits", {&logits, &idx, &values, &log_sum});
    const int64_t V = logits.dim(-1), r = logits.numel() / std::max<int64_t>(V, 1);
    const int64_t n = idx.shape.size() == 2 ? idx.dim(1) : 0;
    HYMOE_CHECK(logits.dtype == DType::f32 && logits.shape.size() == 2 && idx.dtype == DType::i64 &&
                    idx.shape == (Shape{r, n}) && n >= 1 && n <= V && values.dtype == DType::f32 &&
                    values.shape == idx.shape && dtype_size(log_sum.dtype) == sizeof(double) &&
                    log_sum.numel() == r,
                "top_logits: logits ",
                shape_string(logits.shape),
                " idx ",
                shape_string(idx.shape),
                " values ",
                shape_string(values.shape),
                " log_sum ",
                shape_string(log_sum.shape));
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda) {
            cu::top_k_rows(*ctx.stream, logits, n, idx);
            return cu::top_logit_rows(
                *ctx.stream, logits, idx, values, static_cast<double*>(log_sum.data));
        }
    top_logits(logits, idx, values, log_sum);
}

}  // namespace hymoe::ops
