// LoRA adapters on a Ctx (model/lora_views.h): the host slot's run-wise form on the CPU, then
// each adapter's factors on its rows through ops::lora_rows_add (forward) and
// ops::lora_rows_backward (backward), on the dropped-out input when the factors train with
// dropout (ops::dropout_rows, the host slots' masks).
#include "hymoe/model/lora_views.h"

#include "hymoe/backend/ops.h"
#include "hymoe/backend/ops_dropout.h"
#include "hymoe/backend/ops_lora.h"
#include "hymoe/backend/ops_rows.h"
#include "hymoe/core/error.h"
#include "hymoe/model/lora.h"

namespace hymoe::model {

namespace {

// Host slots run on CPU contexts only.
void check_host(const backend::Ctx& ctx, const char* what) {
    HYMOE_CHECK(ctx.device == Device::cpu,
                what,
                ": host adapters on a ",
                to_string(ctx.device),
                " context (upload them as factor views)");
}

// f(rows, factors) for each adapter of `rows` (null: none) that `factors` holds.
template <typename F>
void for_each_factors(const LoraSlotView& factors, const std::vector<LoraRowsView>* rows, F&& f) {
    if (rows == nullptr)
        return;
    for (const LoraRowsView& r : *rows) {
        if (r.adapter < 0 || r.adapter >= static_cast<int>(factors.size()))
            continue;
        const LoraFactorsView& fv = factors[static_cast<size_t>(r.adapter)];
        if (fv.A.data != nullptr)
            f(r, fv);
    }
}

// The dropout of f's inputs (p = 0: none).
ops::DropoutKey dropout_key(const LoraFactorsView& f) {
    if (f.dropout == nullptr)
        return {};
    return {f.dropout->dropout, f.dropout->dropout_seed, f.dropout->dropout_stream};
}

}  // namespace

void lora_forward(const backend::Ctx& ctx,
                  const LoraSlot* host,
                  const LoraSlotView& factors,
                  const SeqBatch& batch,
                  const std::vector<LoraRowsView>* rows,
                  const Tensor& x,
                  Tensor& y) {
    if (host != nullptr) {
        check_host(ctx, "lora_forward");
        lora_forward(host, batch, x, y);
    }
    for_each_factors(factors, rows, [&](const LoraRowsView& r, const LoraFactorsView& f) {
        const ops::DropoutKey key = dropout_key(f);
        if (key.p == 0)
            return ops::lora_rows_add(ctx, r.rows, f.A, f.B, f.scale, x, y);
        backend::Scratch s(ctx);
        Tensor xd = s(DType::f32, x.shape);  // [n, in] drop(x)
        ops::dropout_rows(ctx, x, key, xd);
        ops::lora_rows_add(ctx, r.rows, f.A, f.B, f.scale, xd, y);
    });
}

void lora_backward(const backend::Ctx& ctx,
                   LoraSlot* host,
                   const LoraSlotView& factors,
                   const SeqBatch& batch,
                   const std::vector<LoraRowsView>* rows,
                   const Tensor& x,
                   const Tensor& dy,
                   Tensor& dx) {
    if (host != nullptr) {
        check_host(ctx, "lora_backward");
        lora_backward(host, batch, x, dy, dx);
    }
    for_each_factors(factors, rows, [&](const LoraRowsView& r, const LoraFactorsView& f) {
        Tensor dA = f.dA, dB = f.dB;  // views: the gradients are written through them
        const ops::DropoutKey key = dropout_key(f);
        if (key.p == 0)
            return ops::lora_rows_backward(ctx, r.rows, f.A, f.B, f.scale, x, dy, dA, dB, dx);
        // the adapter saw drop(x): its gradients from drop(x), dx += drop(∂/∂ drop(x))
        backend::Scratch s(ctx);
        Tensor xd = s(DType::f32, x.shape), dxd = s(DType::f32, x.shape);  // [n, in]
        ops::dropout_rows(ctx, x, key, xd);
        ops::fill_zero(ctx, dxd);
        ops::lora_rows_backward(ctx, r.rows, f.A, f.B, f.scale, xd, dy, dA, dB, dxd);
        ops::dropout_rows(ctx, dxd, key, dxd);
        ops::add_inplace(ctx, dx, dxd);
    });
}

}  // namespace hymoe::model
