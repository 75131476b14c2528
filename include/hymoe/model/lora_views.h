// LoRA adapters as views on a Ctx's device (the GPU model's uploaded factors), beside the host
// slots of model/lora.h: each adapter's factors by id, and a call's rows of each adapter as an
// index list on the same device, so that a block adds the adapters' share, and takes its backward,
// with one op on its Ctx (ops::lora_rows_add, ops::lora_rows_backward) on either backend. Host
// slots keep lora.h's run-wise arithmetic and dropout, on CPU contexts.
#pragma once

#include <vector>

#include "hymoe/backend/ctx.h"
#include "hymoe/model/batch.h"
#include "hymoe/tensor/tensor.h"

namespace hymoe::model {

struct LoraSlot;

// One adapter on one projection W [out, in]; A empty: the adapter leaves it alone.
struct LoraFactorsView {
    Tensor A;  // [r, in] f32
    Tensor B;  // [out, r] f32
    float scale = 1.0f;
    Tensor dA{};  // [r, in] f32 gradient, accumulated (+=) by lora_backward; empty: frozen
    Tensor dB{};  // [out, r] f32 (default-initialised: the aggregate initialisers name A, B, scale)
    // Training: the host slot whose dropout (p, seed, stream: lora.h) the factors apply to their
    // f32 input, read at each call (ops::dropout_rows, each row keyed by its index in the call);
    // null or p = 0: none.
    const LoraSlot* dropout = nullptr;
};
using LoraSlotView = std::vector<LoraFactorsView>;  // by adapter id; empty: none

// Where a mixer's adapters attach, as model/lora.h LoraSlots.
struct MixerLoraViews {
    LoraSlotView q, k, v, kv, o;
};

// One adapter's rows in a call (i64 [m] on the Ctx's device, ascending).
struct LoraRowsView {
    int adapter = 0;
    Tensor rows;
};

// y [n_tok, out] += the adapters' share of x [n_tok, in] on one projection: the host slot's
// (lora_forward over batch, a CPU context only; null: none) and, for each adapter of `rows` (null:
// none) that `factors` holds, its factors' on its rows.
void lora_forward(const backend::Ctx& ctx,
                  const LoraSlot* host,
                  const LoraSlotView& factors,
                  const SeqBatch& batch,
                  const std::vector<LoraRowsView>* rows,
                  const Tensor& x,
                  Tensor& y);

// The backward of the same call, f32: dx [n_tok, in] += the adapters' share of the input gradient
// for dy [n_tok, out], and each adapter's dA, dB += its gradient (host slots: lora.h
// lora_backward, a CPU context only; factor views: ops::lora_rows_backward, frozen ones, without
// dA, give dx only).
void lora_backward(const backend::Ctx& ctx,
                   LoraSlot* host,
                   const LoraSlotView& factors,
                   const SeqBatch& batch,
                   const std::vector<LoraRowsView>* rows,
                   const Tensor& x,
                   const Tensor& dy,
                   Tensor& dx);

}  // namespace hymoe::model
