// The vision tower's steps as ops on a Ctx (model/vision_views.h runs them; model-math §8): a
// linear layer with its bias and GELU, MoonViT's 2-D RoPE, the attention of packed images (each
// image over its own patches only) and the pooling + patch merge as a gather of row means (the
// copy of the result back to the host is ops_rows.h's download). Each CPU form
// (src/backend/cpu/vision_ops.cpp) keeps the loop order of the CPU tower it replaced, so CPU
// results are bit for bit what they were; the CUDA forms queue the kernels of
// backend/cuda_vision.h. The switch is src/backend/ops_vision.cpp's. Every tensor f32 unless said;
// lengths are host values.
#pragma once

#include <cstdint>
#include <vector>

#include "hymoe/backend/ctx.h"
#include "hymoe/backend/ops_rows.h"  // download, the tower's tokens to the host
#include "hymoe/tensor/tensor.h"

namespace hymoe::ops {

// The activation after a bias: none, GELU with the tanh approximation (the ViT MLP's fc0) or with
// erf (the projector's linear_1, HF GELUActivation).
enum class BiasAct { none, gelu_tanh, gelu_erf };

// Heads whose fp32 scores [m, m] fit in free_bytes at once, between 1 and n_head.
int64_t heads_at_once(int64_t m, int64_t n_head, int64_t free_bytes);

// ---- CPU forms ------------------------------------------------------------------------------

// x [n, w] ← act(x + b), b [w] added to every row.
void bias_act(Tensor& x, const Tensor& b, BiasAct act);
// 2-D RoPE in place on n tokens: token t's n_head heads of head_dim floats at x + t·token_stride
// + h·head_dim turn by pos [n, 2] (row, column of its patch): pair j (elements 2j, 2j + 1) by
// column·θ_{j/2} when j is even, row·θ_{j/2} when odd, θ_i = 10000^{−4i/head_dim} (rounded from
// double), head_dim a multiple of 4.
void rope_2d(float* x,
             int64_t n,
             int64_t n_head,
             int64_t head_dim,
             int64_t token_stride,
             const int32_t* pos);
// o [n, C] = per image (lengths: patches of each, Σ = n, packed in order) and head h: softmax(τ
// q_h k_hᵀ) v_h over the image's own patches, qkv [n, 3C] rows [q heads | k heads | v heads],
// τ = 1/√(C/n_head); one head's scores [m, m] at a time.
void vision_attention(const Tensor& qkv,
                      const std::vector<int64_t>& lengths,
                      int64_t n_head,
                      Tensor& o);
// out [r, w] row i = (Σ_{j<g} x [m, w] row idx[i, j], summed from 0 in j order) · (1/g) for
// idx [r, g] i64 (g = pool²: the pooling's means; g = 1 copies; model/vision_plan.h
// pool_merge_rows puts them in the patch merger's order).
void gather_mean_rows(const Tensor& x, const Tensor& idx, Tensor& out);

// ---- on a Ctx ---------------------------------------------------------------------------------

// y [n, out] = act(x [n, in] · wᵀ + b), w [out, in] (f32, or bf16 on CUDA), b [out].
void linear_bias(const backend::Ctx& ctx,
                 const Tensor& x,
                 const Tensor& w,
                 const Tensor& b,
                 BiasAct act,
                 Tensor& y);
// rope_2d on heads [0, n_head) of every row of x [n, width] (token_stride = width), pos [n, 2]
// i32 on ctx's device.
void rope_2d(
    const backend::Ctx& ctx, Tensor& x, int64_t n_head, int64_t head_dim, const Tensor& pos);
// vision_attention; on CUDA as many heads at once as heads_at_once(m, n_head, scores_bytes)
// allows (their scores from ctx's scratch), on the CPU one (scores_bytes unused).
void vision_attention(const backend::Ctx& ctx,
                      const Tensor& qkv,
                      const std::vector<int64_t>& lengths,
                      int64_t n_head,
                      int64_t scores_bytes,
                      Tensor& o);
// The heads vision_attention scores at once for an image of m patches.
int64_t vision_heads_at_once(const backend::Ctx& ctx,
                             int64_t m,
                             int64_t n_head,
                             int64_t scores_bytes);
void gather_mean_rows(const backend::Ctx& ctx, const Tensor& x, const Tensor& idx, Tensor& out);

}  // namespace hymoe::ops
