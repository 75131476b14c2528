// Small data movement ops on a Ctx for the layers' plumbing (the MoE dispatch, model/moe.cpp):
// zero fill, dtype cast, row gather, the copy of a device tensor to the host, and the wait for
// the queued work. CPU forms are plain host loops; CUDA forms are cuda_model_ops.h's zero, cast
// and gather_rows and cuda_arena.h's download. The switch is src/backend/ops.cpp's.
#pragma once

#include "hymoe/backend/ctx.h"
#include "hymoe/tensor/tensor.h"

namespace hymoe::ops {

// t ← 0 (every byte).
void fill_zero(const backend::Ctx& ctx, Tensor& t);

// dst ← src element by element: f32 ↔ bf16 (rounded to nearest even), or a plain copy of equal
// dtypes; equal element counts.
void cast(const backend::Ctx& ctx, const Tensor& src, Tensor& dst);

// dst [n, w] row i = src [m, w] row idx[i], idx i64 [n] (each in [0, m)); src and dst of one
// dtype.
void gather_rows(const backend::Ctx& ctx, const Tensor& src, const Tensor& idx, Tensor& dst);

// host ← src (on ctx's device) of equal dtype and element count, complete when this returns
// (CUDA: waits for the stream). host is a CPU tensor.
void download(const backend::Ctx& ctx, const Tensor& src, Tensor& host);

// Returns once everything queued on ctx has run (CPU: at once): before a collective (comm::) that
// reads or writes ctx's tensors on a stream of its own.
void synchronize(const backend::Ctx& ctx);

}  // namespace hymoe::ops
