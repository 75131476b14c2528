// The ops of the MLA/DSA block (model/attention.cpp, spec/model-math.md §4-5) beside the products
// and norms of ops.h, on a Ctx (backend/ctx.h): RoPE over the strided heads of a row, a column
// slice, the indexer key's LayerNorm, and a call's host data (the positions) copied to ctx's
// device. CPU: exactly the CPU forms of ops.h; CUDA: the kernels of backend/cuda_ops.h and
// cuda_model_ops.h (tests/cuda compares them). The device switch is src/backend/ops.cpp's.
#pragma once

#include <cstdint>

#include "hymoe/backend/ctx.h"
#include "hymoe/backend/ops.h"
#include "hymoe/tensor/tensor.h"

namespace hymoe::ops {

using backend::Ctx;

// ops::rope on the rows of x [n_tok, width] (f32): in row t, heads h < n_head starting at column
// col0 + h·head_stride, at position pos[t] (pos [n_tok] int64 on ctx's device).
void rope(const Ctx& ctx,
          Tensor& x,
          int64_t col0,
          int64_t n_head,
          int64_t head_stride,
          const Tensor& pos,
          const RopeFreqs& freqs,
          bool interleaved);
// dst [n, w] = columns [col0, col0 + w) of src [n, width] (MLA's latent split, the norms' inputs
// kept for the backward); f32 or bf16, src and dst alike.
void copy_cols(const Ctx& ctx, const Tensor& src, int64_t col0, Tensor& dst);
// ops::layer_norm per row of x.dim(-1) (the indexer key); y may alias x.
void layer_norm(
    const Ctx& ctx, const Tensor& x, const Tensor& w, const Tensor& b, float eps, Tensor& y);
// dst (on ctx's device) ← the host tensor src, same dtype and element count. CUDA: queued on
// ctx's stream; pageable host memory (a std::vector, a Buffer) is staged before the call returns,
// so src may go right after.
void upload(const Ctx& ctx, const Tensor& src, Tensor& dst);

}  // namespace hymoe::ops
