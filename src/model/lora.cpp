// LoRA adapters: init, and the adapter's share of a projection's forward and backward, one GEMM
// pair (the backward: ops::lora_pair_backward) per run of sequences that share an adapter.
#include "hymoe/model/lora.h"

#include <cmath>

#include "hymoe/backend/ops.h"
#include "hymoe/backend/ops_lora.h"
#include "hymoe/core/error.h"
#include "hymoe/core/rng.h"

namespace hymoe::model {

namespace {

// The adapter id of sequence s (adapter 0 when the batch names none).
int adapter_of(const SeqBatch& batch, int64_t s) {
    return batch.adapter.empty() ? 0 : batch.adapter[s];
}

// Calls f(adapter, first row, rows) for each maximal run of sequences with one adapter that the
// slot holds (runs of sequences without an adapter, or whose pair is empty, are skipped).
template <typename Slot, typename F>  // Slot: LoraSlot or const LoraSlot
void for_each_run(Slot& slot, const SeqBatch& batch, F&& f) {
    int64_t s = 0;
    while (s < batch.n_seq()) {
        const int a = adapter_of(batch, s);
        int64_t e = s + 1;
        while (e < batch.n_seq() && adapter_of(batch, e) == a)
            ++e;
        const int64_t rows = batch.offsets[e] - batch.offsets[s];
        if (a >= 0 && a < static_cast<int>(slot.adapters.size()) &&
            slot.adapters[a].A.view().data != nullptr && rows > 0)
            f(slot.adapters[a], batch.offsets[s], rows);
        s = e;
    }
}

// The inverted-dropout factors m/(1−p) ∈ {0, 1/(1−p)} [rows, in] of rows [row0, row0 + rows) of
// the call: row r draws from (seed, stream, r), the same on every evaluation of the call.
Buffer dropout_factors(const LoraSlot& slot, int64_t row0, int64_t rows, int64_t in) {
    Buffer f(DType::f32, {rows, in});
    const float keep = 1.0f - slot.dropout;
    for (int64_t r = 0; r < rows; ++r) {
        Philox rng(slot.dropout_seed, slot.dropout_stream, static_cast<uint32_t>(row0 + r));
        for (int64_t c = 0; c < in; ++c)
            f.ptr<float>()[r * in + c] = rng.uniform() < keep ? 1.0f / keep : 0.0f;
    }
    return f;
}

// The adapter input of a run: x itself, or x̃ = x ⊙ factors (into xd) when the slot drops.
Tensor adapter_input(
    const Tensor& x, int64_t row0, int64_t rows, const Buffer* factors, Buffer& xd) {
    if (!factors)
        return x.rows(row0, rows);
    const int64_t in = x.dim(1);
    xd = Buffer(DType::f32, {rows, in});
    const float* src = x.ptr<float>() + row0 * in;
    for (int64_t i = 0; i < rows * in; ++i)
        xd.ptr<float>()[i] = src[i] * factors->ptr<float>()[i];
    return xd.view();
}

}  // namespace

LoraPair make_lora_pair(int64_t out,
                        int64_t in,
                        int rank,
                        float scale,
                        uint64_t seed,
                        uint32_t stream,
                        bool trainable) {
    LoraPair p;
    p.A = Buffer(DType::f32, {rank, in});
    p.B = Buffer(DType::f32, {out, rank});
    p.scale = scale;
    // kaiming_uniform(a=√5) on [r, in]: gain √(2/(1+5)), bound gain·√(3/in) = 1/√in
    const float bound = 1.0f / std::sqrt(static_cast<float>(in));
    Philox(seed, stream, 0).fill_uniform(p.A.ptr<float>(), rank * in, -bound, bound);
    if (trainable) {
        p.dA = Buffer(DType::f32, {rank, in});
        p.dB = Buffer(DType::f32, {out, rank});
    }
    return p;
}

void lora_forward(const LoraSlot* slot, const SeqBatch& batch, const Tensor& x, Tensor& y) {
    if (!slot)
        return;
    for_each_run(*slot, batch, [&](const LoraPair& p, int64_t row0, int64_t rows) {
        const int64_t r = p.A.view().dim(0);
        Buffer factors, xd;
        if (slot->dropout > 0.0f)
            factors = dropout_factors(*slot, row0, rows, x.dim(1));
        const Tensor xin =  // [rows, in]
            adapter_input(x, row0, rows, slot->dropout > 0.0f ? &factors : nullptr, xd);
        Buffer a(DType::f32, {rows, r});  // [rows, r] = x̃ Aᵀ
        ops::linear(xin, p.A.view(), a.view());
        for (int64_t i = 0; i < rows * r; ++i)
            a.ptr<float>()[i] *= p.scale;
        Tensor yr = y.rows(row0, rows);
        ops::linear(a.view(), p.B.view(), yr, 1.0f);
    });
}

void lora_backward(
    LoraSlot* slot, const SeqBatch& batch, const Tensor& x, const Tensor& dy, Tensor& dx) {
    if (!slot)
        return;
    for_each_run(*slot, batch, [&](LoraPair& p, int64_t row0, int64_t rows) {
        HYMOE_CHECK(p.dA.view().data != nullptr,
                    "lora_backward: an adapter made without gradients");
        const int64_t in = x.dim(1);
        Buffer factors, xd;
        if (slot->dropout > 0.0f)
            factors = dropout_factors(*slot, row0, rows, in);
        const Tensor xin =  // [rows, in]
            adapter_input(x, row0, rows, slot->dropout > 0.0f ? &factors : nullptr, xd);
        // dA, dB accumulate; dx̃ [rows, in] = s·(dy B) A, then through the mask
        Buffer dxd(DType::f32, {rows, in});
        Tensor dA = p.dA.view(), dB = p.dB.view(), dxv = dxd.view();
        ops::lora_pair_backward(
            p.A.view(), p.B.view(), p.scale, xin, dy.rows(row0, rows), dA, dB, dxv);
        float* d = dx.ptr<float>() + row0 * in;  // dx += dx̃ ⊙ factors (x̃ = x ⊙ factors)
        for (int64_t i = 0; i < rows * in; ++i)
            d[i] += dxd.ptr<float>()[i] * (slot->dropout > 0.0f ? factors.ptr<float>()[i] : 1.0f);
    });
}

}  // namespace hymoe::model
