// The MoE ops on a Ctx (hymoe/backend/ops.h's switch, continued): the router's logits and
// selection, the expert groups' gather, grouped products and combine, and the MoE dispatch's data
// movement. Each checks its tensors, then runs the CPU op or queues the CUDA kernel of the same
// name and semantics (src/backend/ops_switch.h).
#include "hymoe/backend/ops_moe.h"

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
#include "hymoe/backend/kda_batch.h"
#include "hymoe/backend/moe_route.h"
#include "hymoe/backend/ops_attention.h"
#include "hymoe/backend/ops_backward.h"
#include "hymoe/backend/ops_kda.h"
#include "hymoe/backend/ops_kda_backward.h"
#include "hymoe/backend/ops_lora.h"
#include "hymoe/backend/ops_mla.h"
#include "hymoe/backend/ops_reduce.h"
#include "hymoe/backend/ops_router_loss.h"
#include "hymoe/backend/ops_rows.h"
#include "hymoe/backend/scratch_stand_in.h"
#include "hymoe/core/error.h"
#include "ops_switch.h"
#include "stacked.h"

namespace hymoe::ops {

using namespace backend::detail;

// ---- MoE groups (backend/ops_moe.h) -------------------------------------------------------------

void moe_gather(const Ctx& ctx, const Tensor& x, const Tensor& row, int64_t k, Tensor& in) {
    check_on(ctx, "moe_gather", {&x, &row, &in});
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda)
            return cu::moe_permute(*ctx.stream, x, row, k, in);
    moe_gather(x, row, nullptr, k, in);
}

void moe_combine(const Ctx& ctx,
                 const Tensor& out,
                 const Tensor& row,
                 const Tensor& weight,
                 int64_t k,
                 Tensor& y) {
    check_on(ctx, "moe_combine", {&out, &row, &weight, &y});
    HYMOE_CHECK(weight.dtype == DType::f32 && weight.numel() == row.numel(),
                "moe_combine: weight ",
                shape_string(weight.shape),
                " for a row map ",
                shape_string(row.shape));
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda)
            return cu::moe_unpermute(*ctx.stream, out, row, weight, k, y);
    moe_combine(out, row, weight.ptr<float>(), k, y);
}

void fill_zero(const Ctx& ctx, Tensor& t) {
    check_on(ctx, "fill_zero", {&t});
    if (t.numel() == 0)
        return;
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda)
            return cu::zero(t.data, t.bytes(), *ctx.stream);
    std::memset(t.data, 0, t.bytes());
}

void cast(const Ctx& ctx, const Tensor& src, Tensor& dst) {
    check_on(ctx, "cast", {&src, &dst});
    const bool f32_bf16 = src.dtype == DType::f32 && dst.dtype == DType::bf16;
    const bool bf16_f32 = src.dtype == DType::bf16 && dst.dtype == DType::f32;
    HYMOE_CHECK(src.numel() == dst.numel() && (src.dtype == dst.dtype || f32_bf16 || bf16_f32),
                "cast: a ",
                to_string(src.dtype),
                " tensor of ",
                shape_string(src.shape),
                " into a ",
                to_string(dst.dtype),
                " one of ",
                shape_string(dst.shape));
    const int64_t n = src.numel();
    if (n == 0)
        return;
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda)
            return cu::cast(*ctx.stream, src, dst);
    if (f32_bf16)
        for (int64_t i = 0; i < n; ++i)
            dst.ptr<uint16_t>()[i] = float_to_bf16(src.ptr<float>()[i]);
    else if (bf16_f32)
        for (int64_t i = 0; i < n; ++i)
            dst.ptr<float>()[i] = bf16_to_float(src.ptr<uint16_t>()[i]);
    else
        std::memcpy(dst.data, src.data, src.bytes());
}

void download(const Ctx& ctx, const Tensor& src, Tensor& host) {
    check_on(ctx, "download", {&src});
    HYMOE_CHECK(
        host.device == Device::cpu && src.dtype == host.dtype && src.numel() == host.numel(),
        "download: a ",
        to_string(src.dtype),
        " tensor of ",
        shape_string(src.shape),
        " into a host ",
        to_string(host.dtype),
        " one of ",
        shape_string(host.shape));
    if (src.numel() == 0)
        return;
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda) {
            cu::download(src, host, *ctx.stream);
            return ctx.stream->synchronize();
        }
    std::memcpy(host.data, src.data, src.bytes());
}

void synchronize(const Ctx& ctx) {
    check_on(ctx, "synchronize", {});
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda)
            ctx.stream->synchronize();
}

void grouped_linear(const Ctx& ctx,
                    const Tensor& x,
                    const std::vector<Tensor>& w,
                    const std::vector<int64_t>& rows,
                    Tensor& y) {
    check_on(ctx, "grouped_linear", {&x, &y});
    HYMOE_CHECK(w.size() == rows.size(),
                "grouped_linear: ",
                w.size(),
                " matrices, ",
                rows.size(),
                " row counts");
    int64_t total = 0;
    for (int64_t r : rows)
        total += r;
    HYMOE_CHECK(x.dim(0) == total && y.dim(0) == total,
                "grouped_linear: x ",
                shape_string(x.shape),
                ", y ",
                shape_string(y.shape),
                " for ",
                total,
                " grouped rows");
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda) {
            // the experts' matrices as one stacked [E, out, in] tensor (consecutive slices)
            if (w.empty())
                return;
            const Tensor stacked = stacked_slices(ctx, w, "grouped_linear", "matrix");
            if (x.dtype == DType::f32 && stacked.dtype == DType::bf16) {
                // f32 rows of bf16 experts (training): the rows through a bf16 copy, as linear's
                // x; y stays f32 (Blas::grouped_linear's mixed form)
                backend::Scratch scratch(ctx);
                Tensor xc = scratch(DType::bf16, x.shape);
                cu::cast(*ctx.stream, x, xc);
                return ctx.blas->grouped_linear(xc, stacked, rows, y);
            }
            return ctx.blas->grouped_linear(x, stacked, rows, y);
        }
    int64_t begin = 0;
    for (size_t e = 0; e < w.size(); ++e) {
        if (rows[e] > 0) {
            Tensor y_rows = y.rows(begin, rows[e]);
            linear(x.rows(begin, rows[e]), w[e], y_rows);
        }
        begin += rows[e];
    }
}

void router_logits(const Ctx& ctx, const Tensor& x, const Tensor& gate, Tensor& logits) {
    check_on(ctx, "router_logits", {&x, &gate, &logits});
    HYMOE_CHECK(logits.dtype == DType::f32 && gate.dtype == DType::f32 &&
                    logits.shape == Shape({x.dim(0), gate.dim(0)}) && x.dim(1) == gate.dim(1),
                "router_logits: x ",
                shape_string(x.shape),
                ", gate ",
                shape_string(gate.shape),
                ", logits ",
                shape_string(logits.shape));
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda)
            return linear(ctx, x, gate, logits);
    for (int64_t t = 0; t < x.dim(0); ++t) {
        Tensor row = logits.rows(t, 1);
        linear(x.rows(t, 1), gate, row);
    }
}

void moe_route(const Ctx& ctx,
               const MoeRouteRule& rule,
               Tensor& logits,
               const Tensor& bias,
               Tensor& idx,
               Tensor& weight) {
    check_on(ctx, "moe_route", {&logits, &bias, &idx, &weight});
    const int64_t n = logits.dim(0), k = rule.top_k;
    HYMOE_CHECK(logits.dtype == DType::f32 && logits.shape == Shape({n, rule.n_exp}) &&
                    (bias.data == nullptr || bias.shape == Shape({rule.n_exp})) &&
                    idx.dtype == DType::i32 && idx.shape == Shape({n, k}) &&
                    weight.dtype == DType::f32 && weight.shape == Shape({n, k}) && k >= 1 &&
                    rule.n_group >= 1 && rule.n_exp % rule.n_group == 0 &&
                    rule.topk_group <= rule.n_group &&
                    k <= rule.topk_group * (rule.n_exp / rule.n_group),
                "moe_route: logits ",
                shape_string(logits.shape),
                ", idx ",
                shape_string(idx.shape),
                ", weight ",
                shape_string(weight.shape),
                ", E ",
                rule.n_exp,
                ", top_k ",
                k,
                ", groups ",
                rule.topk_group,
                " of ",
                rule.n_group);
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda) {
            cu::MoeRouteParams p;
            p.n_tok = static_cast<int>(n);
            p.n_exp = static_cast<int>(rule.n_exp);
            p.top_k = static_cast<int>(k);
            p.n_group = static_cast<int>(rule.n_group);
            p.topk_group = static_cast<int>(rule.topk_group);
            p.softmax = rule.softmax;
            p.renormalize = rule.renormalize;
            p.renorm_eps = rule.renorm_eps;
            p.scale = rule.scale;
            p.weights_from_biased = rule.weights_from_biased;
            p.group_fill = rule.group_fill;
            p.logits = logits.ptr<float>();
            p.bias = bias.data ? bias.ptr<float>() : nullptr;
            p.idx = idx.ptr<int32_t>();
            p.weight = weight.ptr<float>();
            return cu::moe_route(*ctx.stream, p);
        }
    if (rule.softmax)
        softmax_rows(logits.ptr<float>(), n, rule.n_exp);
    else
        sigmoid_inplace(logits);
    std::vector<int64_t> wide(static_cast<size_t>(n * k));  // [n, k]
    moe_select(
        rule, logits, bias.data ? bias.ptr<float>() : nullptr, wide.data(), weight.ptr<float>());
    std::copy(wide.begin(), wide.end(), idx.ptr<int32_t>());
}

}  // namespace hymoe::ops
