// Inverted dropout of an adapter's input as model/lora.h draws it: row i of a call keeps column
// c, scaled by 1/(1−p), iff the c-th uniform of Philox(seed, stream, subkey i) (core/rng.h) is
// below 1 − p, and is zeroed otherwise; so a row's mask depends only on its index in the call and
// the key, and the forward and backward of a pass draw the same one. The CPU form, and the op on
// a Ctx (CUDA: one thread an element, Philox4x32-10 on the device, src/backend/cuda/dropout.cu).
#pragma once

#include <cstdint>

#include "hymoe/backend/ctx.h"
#include "hymoe/tensor/tensor.h"

namespace hymoe::ops {

struct DropoutKey {
    float p = 0;  // in [0, 1)
    uint64_t seed = 0;
    uint32_t stream = 0;
};

// y [n, in] = x [n, in] ⊙ the mask's factors {0, 1/(1−p)}, f32; y may alias x.
void dropout_rows(const Tensor& x, const DropoutKey& key, Tensor& y);
// Throws naming the shapes unless x and y are f32 [n, in] and 0 ≤ p < 1 (both forms check).
void check_dropout_rows(const Tensor& x, const DropoutKey& key, const Tensor& y);
void dropout_rows(const backend::Ctx& ctx, const Tensor& x, const DropoutKey& key, Tensor& y);

}  // namespace hymoe::ops
