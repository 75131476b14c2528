// Small data movement ops on a Ctx for the layers' plumbing (the MoE dispatch, model/moe.cpp; the
// loss head's rows with a target, model/train.cpp): zero fill, dtype cast, row gather and
// scatter by an index list, the copy of a device tensor to the host, and the wait for the queued
// work. CPU forms are plain host loops (the row moves' in src/backend/cpu/rows.cpp, one memcpy a
// row); CUDA forms are cuda_model_ops.h's zero, cast, gather_rows and scatter_rows and
// cuda_arena.h's download. The switch: src/backend/ops_train.cpp, ops_moe.cpp.
#pragma once

#include "hymoe/backend/ctx.h"
#include "hymoe/tensor/tensor.h"

namespace hymoe::ops {

// dst [m, w] row i = src [n, w] row idx[i]; idx i64 [m], each in [0, n). src and dst of one dtype.
void gather_rows(const Tensor& src, const Tensor& idx, Tensor& dst);
// dst [n, w] row idx[i] = src [m, w] row i (distinct idx); dst's other rows untouched.
void scatter_rows(const Tensor& src, const Tensor& idx, Tensor& dst);

using backend::Ctx;

// t ← 0 (every byte).
void fill_zero(const Ctx& ctx, Tensor& t);

// dst ← src element by element: f32 ↔ bf16 (rounded to nearest even), or a plain copy of equal
// dtypes; equal element counts.
void cast(const Ctx& ctx, const Tensor& src, Tensor& dst);

// The row moves above on ctx's device.
void gather_rows(const Ctx& ctx, const Tensor& src, const Tensor& idx, Tensor& dst);
void scatter_rows(const Ctx& ctx, const Tensor& src, const Tensor& idx, Tensor& dst);

// host ← src (on ctx's device) of equal dtype and element count, complete when this returns
// (CUDA: waits for the stream). host is a CPU tensor.
void download(const Ctx& ctx, const Tensor& src, Tensor& host);

// Returns once everything queued on ctx has run (CPU: at once): before a collective (comm::) that
// reads or writes ctx's tensors on a stream of its own.
void synchronize(const Ctx& ctx);

}  // namespace hymoe::ops
