// The fused MoE experts as an op on a Ctx (backend/cuda_fused.h's MoE kernels): from each token's
// routing on the device, the dispatch plan, the two grouped SwiGLU launches over every expert and
// the slot-ordered combine, with no host round trip. bf16 SwiGLU experts, dropless, CUDA only (no
// CPU form: the host path is ops_moe.h's grouped products); moe_fused_supported is the host-side
// check of the shapes the kernels take (plain C++ in every build). The switch is
// src/backend/ops_moe_fused.cpp's.
#pragma once

#include <cstdint>
#include <vector>

#include "hymoe/backend/ctx.h"
#include "hymoe/tensor/tensor.h"

namespace hymoe::ops {

// Whether the fused kernels take n_tok rows of width w routed to top_k of n_exp SwiGLU experts of
// width inter with inputs of dtype act: act bf16, SwiGLU, dropless (no capacity dropping), E ≤ 1024
// and the widths the grouped kernels tile (backend/cuda_fused.h moe_plan: w a multiple of 128,
// inter of 64).
struct MoeFusedShape {
    DType act = DType::f32;  // the experts' inputs and matrices
    bool swiglu = false;     // the experts' activation is SwiGLU
    bool dropless = false;   // no capacity dropping
    int64_t n_tok = 0;
    int top_k = 0;
    int n_exp = 0;      // E
    int64_t width = 0;  // w: the experts' input and output width
    int64_t inter = 0;  // I: the experts' intermediate width
};
bool moe_fused_supported(const MoeFusedShape& s);

// acc [n, w] f32 = Σ over each token's slots, in slot order, of weight · Expert_idx(z row), for
// Expert_e(u) = W2_e (SiLU(W1_e u) ⊙ W3_e u): idx [n, k] i32 (each token's experts, best first)
// and weight [n, k] f32 from ops::moe_route, z [n, w] bf16, gate and up [E] of [I, w] and down
// [E] of [w, I] bf16, each list the E slices of one stacked [E, ·, ·] tensor. Overwrites acc.
// load (null: not asked) gets each expert's assignments [E]: one download, which waits for the
// stream (so not inside a captured graph). CUDA contexts only; the shapes must pass
// moe_fused_supported.
void moe_fused_experts(const backend::Ctx& ctx,
                       const Tensor& idx,
                       const Tensor& weight,
                       const Tensor& z,
                       const std::vector<Tensor>& gate,
                       const std::vector<Tensor>& up,
                       const std::vector<Tensor>& down,
                       Tensor& acc,
                       std::vector<int64_t>* load);

}  // namespace hymoe::ops
