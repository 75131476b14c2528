// LoRA adapters on a block's projections (spec/model-math.md §9, PEFT semantics): a projection
// y = x Wᵀ with an adapter becomes y = x Wᵀ + s · drop(x) Aᵀ Bᵀ, A [r, in], B [out, r],
// s = α/r (α/√r with rsLoRA), inverted dropout on the adapter input only. One slot holds every
// adapter of one projection, indexed by adapter id, so one batch can mix sequences that use
// different adapters (one base model, many scenarios); SeqBatch::adapter picks one per sequence.
// The blocks call lora_forward after their base product and lora_backward beside the base
// product's backward; a null slot costs nothing. The dropout mask is a pure function of
// (slot key, row, column) through the counter RNG, so a recomputed forward draws the same mask.
#pragma once

#include <cstdint>
#include <vector>

#include "hymoe/model/batch.h"
#include "hymoe/tensor/tensor.h"

namespace hymoe::model {

// One adapter on one projection W [out, in].
struct LoraPair {
    Buffer A;  // [r, in]   fp32
    Buffer B;  // [out, r]  fp32
    float scale = 1.0f;
    Buffer dA;  // [r, in]   gradient, accumulated by lora_backward (training; else empty)
    Buffer dB;  // [out, r]
};

// Every adapter of one projection. adapters[a] is adapter id a; an empty pair (no A) means that
// adapter leaves this projection alone.
struct LoraSlot {
    std::vector<LoraPair> adapters;
    float dropout = 0.0f;         // training only: p of the inverted dropout on the adapter input
    uint64_t dropout_seed = 0;    // the mask's key: change it per step (and micro-batch)
    uint32_t dropout_stream = 0;  // the module name's stream (name_stream): per projection
};

// Where a block's adapters attach. Null pointers: no adapter. KDA: q, k, v, o are q_proj,
// k_proj, v_proj, o_proj. MLA/DSA: q is q_proj (or q_b_proj with a query latent), kv is
// kv_a_proj_with_mqa (the projection to the cached latent and rope key, so an adapter's effect
// lives in the cache, and absorbed decode needs no change), o is o_proj. FFNs: gate, up, down.
struct LoraSlots {
    LoraSlot* q = nullptr;
    LoraSlot* k = nullptr;
    LoraSlot* v = nullptr;
    LoraSlot* kv = nullptr;
    LoraSlot* o = nullptr;
    LoraSlot* gate = nullptr;
    LoraSlot* up = nullptr;
    LoraSlot* down = nullptr;
};

// A new adapter: A Kaiming-uniform (bound 1/√in, nn.Linear's default, as PEFT), B zero, with
// optimizer-free gradient buffers when `trainable`. `stream` keys A's draws with `seed`.
LoraPair make_lora_pair(
    int64_t out, int64_t in, int rank, float scale, uint64_t seed, uint32_t stream, bool trainable);

// y [n_tok, out] += s · drop(x) Aᵀ Bᵀ for each sequence's adapter (batch.adapter; empty: adapter
// 0 for every row). x [n_tok, in]. Nothing when slot is null.
void lora_forward(const LoraSlot* slot, const SeqBatch& batch, const Tensor& x, Tensor& y);

// The adapter's backward for the same call: dA += s·(dy B)ᵀ drop(x), dB += s·dyᵀ (drop(x) Aᵀ),
// dx [n_tok, in] += s·((dy B) A) ⊙ mask/(1−p). Nothing when slot is null.
void lora_backward(LoraSlot* slot,
                   const SeqBatch& batch,
                   const Tensor& x,   // [n_tok, in] the projection's input in the forward
                   const Tensor& dy,  // [n_tok, out]
                   Tensor& dx);       // [n_tok, in] accumulated into

}  // namespace hymoe::model
