// The vision tower's ops on a Ctx (hymoe/backend/ops.h's switch, continued; backend/ops_vision.h).
// Each checks its tensors, then runs the CPU op or queues the CUDA kernel of the same name and
// semantics (src/backend/ops_switch.h).
#include "hymoe/backend/ops_vision.h"

#include <cstring>
#include <utility>
#include <vector>

#include "hymoe/backend/cuda_backward.h"
#include "hymoe/backend/cuda_fused.h"
#include "hymoe/backend/cuda_gemm.h"
#include "hymoe/backend/cuda_kda_backward.h"
#include "hymoe/backend/cuda_kda_batch.h"
#include "hymoe/backend/cuda_model_ops.h"
#include "hymoe/backend/cuda_ops.h"
#include "hymoe/backend/cuda_reduce.h"
#include "hymoe/backend/cuda_router_loss.h"
#include "hymoe/backend/cuda_vision.h"
#include "hymoe/backend/kda_batch.h"
#include "hymoe/backend/moe_route.h"
#include "hymoe/backend/ops_attention.h"
#include "hymoe/backend/ops_backward.h"
#include "hymoe/backend/ops_kda.h"
#include "hymoe/backend/ops_kda_backward.h"
#include "hymoe/backend/ops_lora.h"
#include "hymoe/backend/ops_mla.h"
#include "hymoe/backend/ops_moe.h"
#include "hymoe/backend/ops_reduce.h"
#include "hymoe/backend/ops_router_loss.h"
#include "hymoe/backend/ops_rows.h"
#include "hymoe/backend/scratch_stand_in.h"
#include "hymoe/core/error.h"
#include "ops_switch.h"

namespace hymoe::ops {

using namespace backend::detail;

void linear_bias(
    const Ctx& ctx, const Tensor& x, const Tensor& w, const Tensor& b, BiasAct act, Tensor& y) {
    check_on(ctx, "linear_bias", {&x, &w, &b, &y});
    linear(ctx, x, w, y);
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda)
            return cu::bias_act(*ctx.stream, y, b, act);
    bias_act(y, b, act);
}

void rope_2d(const Ctx& ctx, Tensor& x, int64_t n_head, int64_t head_dim, const Tensor& pos) {
    check_on(ctx, "rope_2d", {&x, &pos});
    HYMOE_CHECK(x.dtype == DType::f32 && x.shape.size() == 2 && n_head * head_dim <= x.dim(1) &&
                    pos.dtype == DType::i32 && pos.numel() == 2 * x.dim(0),
                "rope_2d: x ",
                shape_string(x.shape),
                " of ",
                n_head,
                " heads of ",
                head_dim,
                ", pos ",
                to_string(pos.dtype),
                shape_string(pos.shape));
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda)
            return cu::rope_2d(*ctx.stream,
                               x.ptr<float>(),
                               x.dim(0),
                               n_head,
                               head_dim,
                               x.dim(1),
                               pos.ptr<int32_t>());
    rope_2d(x.ptr<float>(), x.dim(0), n_head, head_dim, x.dim(1), pos.ptr<int32_t>());
}

int64_t vision_heads_at_once(const Ctx& ctx, int64_t m, int64_t n_head, int64_t scores_bytes) {
    return ctx.device == Device::cuda ? heads_at_once(m, n_head, scores_bytes) : 1;
}

void vision_attention(const Ctx& ctx,
                      const Tensor& qkv,
                      const std::vector<int64_t>& lengths,
                      int64_t n_head,
                      int64_t scores_bytes,
                      Tensor& o) {
    check_on(ctx, "vision_attention", {&qkv, &o});
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda)
            return cu::vision_attention(ctx, qkv, lengths, n_head, scores_bytes, o);
    vision_attention(qkv, lengths, n_head, o);
}

void gather_mean_rows(const Ctx& ctx, const Tensor& x, const Tensor& idx, Tensor& out) {
    check_on(ctx, "gather_mean_rows", {&x, &idx, &out});
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda)
            return cu::gather_mean_rows(*ctx.stream, x, idx, out);
    gather_mean_rows(x, idx, out);
}

}  // namespace hymoe::ops
