// The fused MoE experts on a Ctx (hymoe/backend/ops_moe_fused.h): the shape check in every build,
// the CUDA launches (cuda_fused.h: dispatch plan, grouped SwiGLU experts, combine) behind the
// device switch of src/backend/ops_switch.h.
#include "hymoe/backend/ops_moe_fused.h"

#include <cstdint>
#include <vector>

#include "hymoe/backend/cuda_arena.h"
#include "hymoe/backend/cuda_fused.h"
#include "hymoe/core/error.h"
#include "ops_switch.h"
#include "stacked.h"

namespace hymoe::ops {

using namespace backend::detail;

bool moe_fused_supported(const MoeFusedShape& s) {
    return s.act == DType::bf16 && s.swiglu && s.dropless && s.n_exp <= 1024 &&
           s.width <= INT32_MAX && s.inter <= INT32_MAX &&
           backend::cuda::moe_plan(
               s.n_tok, s.top_k, s.n_exp, static_cast<int>(s.width), static_cast<int>(s.inter))
               .supported;
}

void moe_fused_experts(const backend::Ctx& ctx,
                       const Tensor& idx,
                       const Tensor& weight,
                       const Tensor& z,
                       const std::vector<Tensor>& gate,
                       const std::vector<Tensor>& up,
                       const std::vector<Tensor>& down,
                       Tensor& acc,
                       std::vector<int64_t>* load) {
    check_on(ctx, "moe_fused_experts", {&idx, &weight, &z, &acc});
    HYMOE_CHECK(ctx.device == Device::cuda,
                "moe_fused_experts: the fused MoE kernels run on a CUDA context only");
    const Tensor w1 = stacked_slices(ctx, gate, "moe_fused_experts", "gate matrix"),
                 w3 = stacked_slices(ctx, up, "moe_fused_experts", "up matrix"),
                 w2 = stacked_slices(ctx, down, "moe_fused_experts", "down matrix");
    HYMOE_CHECK(w1.dtype == DType::bf16 && w3.dtype == DType::bf16 && w2.dtype == DType::bf16,
                "moe_fused_experts: the experts' gate, up and down matrices are ",
                to_string(w1.dtype),
                ", ",
                to_string(w3.dtype),
                " and ",
                to_string(w2.dtype),
                ", not bf16");
    const int64_t n = z.dim(0), w = z.dim(1), k = idx.dim(1), n_exp = w1.dim(0), inter = w1.dim(1);
    HYMOE_CHECK(z.dtype == DType::bf16 && idx.dtype == DType::i32 && weight.dtype == DType::f32 &&
                    acc.dtype == DType::f32 && idx.shape == Shape({n, k}) &&
                    weight.shape == idx.shape && acc.shape == z.shape &&
                    w1.shape == Shape({n_exp, inter, w}) && w3.shape == w1.shape &&
                    w2.shape == Shape({n_exp, w, inter}),
                "moe_fused_experts: idx ",
                shape_string(idx.shape),
                ", weight ",
                shape_string(weight.shape),
                ", z ",
                shape_string(z.shape),
                ", acc ",
                shape_string(acc.shape),
                ", experts ",
                shape_string(w1.shape),
                " / ",
                shape_string(w2.shape));
    const MoeFusedShape shape{
        DType::bf16, true, true, n, static_cast<int>(k), static_cast<int>(n_exp), w, inter};
    HYMOE_CHECK(moe_fused_supported(shape),
                "moe_fused_experts: ",
                n_exp,
                " experts of width ",
                w,
                " x ",
                inter,
                " (top ",
                k,
                ") are off the fused kernels' shapes");
    if constexpr (kCudaBuild) {
        if (n == 0) {
            if (load != nullptr)
                load->assign(static_cast<size_t>(n_exp), 0);
            return;
        }
        const cu::MoePlan plan =
            cu::moe_plan(n, static_cast<int>(k), static_cast<int>(n_exp), w, inter);
        backend::Scratch s(ctx);
        Tensor scratch = s(DType::i32, {(plan.scratch_bytes + 3) / 4});
        const cu::MoeDispatch d = cu::moe_dispatch_arrays(
            plan, static_cast<int>(n), static_cast<int>(k), static_cast<int>(n_exp), scratch.data);
        cu::moe_dispatch_plan(*ctx.stream, plan, idx.ptr<int32_t>(), d);
        Tensor h = s(DType::bf16, {n * k, inter});  // [n_assign, I]
        Tensor out = s(DType::bf16, {n * k, w});    // [n_assign, w]
        cu::MoeExpertParams ep;
        ep.d = static_cast<int>(w);
        ep.inter = static_cast<int>(inter);
        ep.x = z.data;
        ep.w1 = w1.data;
        ep.w3 = w3.data;
        ep.w2 = w2.data;
        ep.h = h.data;
        ep.out = out.data;
        cu::moe_experts(*ctx.stream, plan, d, ep);
        cu::moe_combine(
            *ctx.stream, d, out.data, weight.ptr<float>(), ep.d, DType::f32, acc.data, false);
        if (load == nullptr)
            return;
        std::vector<int32_t> offset(static_cast<size_t>(n_exp) + 1);  // [E + 1] grouped rows
        cu::copy_to_host(offset.data(), d.offset, offset.size() * sizeof(int32_t), *ctx.stream);
        ctx.stream->synchronize();
        load->assign(static_cast<size_t>(n_exp), 0);
        for (size_t e = 0; e < load->size(); ++e)
            (*load)[e] = offset[e + 1] - offset[e];
    }
}

}  // namespace hymoe::ops
