// The device kernels of the vision tower (model/vision.h; the GPU model's encoder,
// src/model/cuda/device_vision.cpp) beyond the shared ops of cuda_ops.h: the bias add with the
// tower's two GELUs, MoonViT's 2-D RoPE over a packed batch of images at once, and the pooling +
// patch merge as a gather of row means. f32 device tensors, every call asynchronous on `s`, fp32
// arithmetic in the CPU's order (model/vision.cpp). CUDA builds only (src/backend/cuda/vision.cu);
// no CUDA header here.
#pragma once

#include <cstdint>

#include "hymoe/backend/cuda_arena.h"
#include "hymoe/tensor/tensor.h"

namespace hymoe::backend::cuda {

// The activation after a bias: none, GELU with the tanh approximation (the ViT MLP's fc0) or with
// erf (the projector's linear_1, HF GELUActivation).
enum class BiasAct { none, gelu_tanh, gelu_erf };

// x [n, w] ← act(x + b) with b [w] added to every row (model/vision.cpp linear_bias, then its
// GELU), f32.
void bias_act(const Stream& s, Tensor& x, const Tensor& b, BiasAct act);

// model::rope_2d on every token of a packed batch in one launch, f32 in place: token t's n_head
// heads of head_dim floats at x + t·token_stride + h·head_dim turn by its patch's place in its own
// image, pos [n, 2] int32 (row, column; model::patch_positions). head_dim a multiple of 4 and at
// most 4·kMaxRope2dFreqs; the angles are float products, their cos and sin taken in double and
// rounded, as the CPU's std::cos / std::sin of the same float.
constexpr int kMaxRope2dFreqs = 64;
void rope_2d(const Stream& s,
             float* x,
             int64_t n,
             int64_t n_head,
             int64_t head_dim,
             int64_t token_stride,
             const int32_t* pos);

// out [r, w] row i = (Σ_{j<g} x [m, w] row idx[i, j], summed from 0 in j order) · (1/g) for
// idx [r, g] int64: model::vision_pool's means (g = pool², g = 1 copies) in the merger's row
// order when idx is model::pool_merge_rows. f32.
void gather_mean_rows(const Stream& s, const Tensor& x, const Tensor& idx, Tensor& out);

}  // namespace hymoe::backend::cuda
