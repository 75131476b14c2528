// The device kernels of the vision tower's ops on a Ctx (backend/ops_vision.h, whose CUDA forms
// call them; model/vision_views.h runs the tower) beyond the shared ops of cuda_ops.h: the bias
// add with the tower's two GELUs, MoonViT's 2-D RoPE over a packed batch of images at once, and
// the pooling + patch merge as a gather of row means; and the packed images' attention (cuBLAS
// and the shared softmax). f32 device tensors, every call asynchronous on `s` (or ctx's stream),
// fp32 arithmetic in the CPU forms' order (src/backend/cpu/vision_ops.cpp). CUDA builds only
// (src/backend/cuda/vision.cu, vision_attention.cpp); no CUDA header here.
#pragma once

#include <cstdint>
#include <vector>

#include "hymoe/backend/cuda_arena.h"
#include "hymoe/backend/ops_vision.h"
#include "hymoe/tensor/tensor.h"

namespace hymoe::backend::cuda {

// The activation after a bias (backend/ops_vision.h).
using BiasAct = ops::BiasAct;

// x [n, w] ← act(x + b) with b [w] added to every row (ops::bias_act), f32.
void bias_act(const Stream& s, Tensor& x, const Tensor& b, BiasAct act);

// ops::rope_2d on every token of a packed batch in one launch, f32 in place: token t's n_head
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
// idx [r, g] int64 (ops::gather_mean_rows): the pooling's means (g = pool², g = 1 copies) in the
// merger's row order when idx is model::pool_merge_rows. f32.
void gather_mean_rows(const Stream& s, const Tensor& x, const Tensor& idx, Tensor& out);

// The CUDA form of ops::vision_attention (src/backend/cuda/vision_attention.cpp).
void vision_attention(const Ctx& ctx,
                      const Tensor& qkv,
                      const std::vector<int64_t>& lengths,
                      int64_t n_head,
                      int64_t scores_bytes,
                      Tensor& o);

}  // namespace hymoe::backend::cuda
