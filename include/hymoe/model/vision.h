// The vision path of model-math §8 (Kimi-VL's MoonViT tower + 2×2 patch merger + projector), on
// packed images of different sizes (NaViT: every image's patches concatenated, attention within
// each image only). Per image of grid (h, w) patches:
//   patches [h·w, 3·p·p] (row-major over the grid; each patch channel-major c, ky, kx)
//   x = patches · W_pᵀ + b_p + bicubic(pos_emb [S, S, C] → [h, w, C])      (Conv2d k=p, s=p)
//   N blocks: x += wo(Attn(RoPE2D(q), RoPE2D(k), v)), q,k,v = wqkv(LN0 x) (+ biases);
//             x += fc1(GELU_tanh(fc0(LN1 x)))                               (LayerNorm ε 1e-5)
//   x = final_layernorm(x)
//   optional pooling: mean over pool×pool cells of the grid → grid (h/pool, w/pool) (our feature
//     compression, not in MoonViT; pool = 1 is MoonViT)
//   merge: [h'/m·w'/m, m·m, C], cells row-major, inside a cell (ih, iw) row-major
//   projector: LN(C) per patch → view [n, m²C] → linear_1 + GELU (erf, HF GELUActivation) →
//              linear_2 → [n, d]
// 2-D RoPE: head dim dh has dh/2 interleaved pairs (x_2j, x_2j+1); pair j = 2i is rotated by
// column·θ_i, pair 2i+1 by row·θ_i, θ_i = 10000^{−4i/dh}, i < dh/4 (MoonViT Rope2DPosEmb).
// Weight names: vision_tower.{patch_embed.proj, patch_embed.pos_emb, encoder.blocks.N.{norm0,
// wqkv, wo, norm1, mlp.fc0, mlp.fc1}, encoder.final_layernorm}, multi_modal_projector.{pre_norm,
// linear_1, linear_2}. fp32 throughout; the tower is replicated (never cut over tp).
// The steps below are the host weights' entry points into the one forward on a Ctx
// (model/vision_views.h), each run on a CPU context.
#pragma once

#include <cstdint>
#include <vector>

#include "hymoe/model/config.h"
#include "hymoe/model/weights.h"

namespace hymoe::model {

// The tower's tensors held as T: Buffer for the host weights (VisionWeights), Tensor for views on
// any one device (model/vision_views.h VisionWeightViews). Fields in vision_tensors' order.
template <class T>
struct VisionBlockParts {
    T norm0_w, norm0_b;  // [C] norm0
    T wqkv_w;            // [3C, C] wqkv.weight: rows [q heads | k heads | v heads]
    T wqkv_b;            // [3C]
    T wo_w, wo_b;        // [C, C], [C]
    T norm1_w, norm1_b;  // [C] norm1
    T fc0_w, fc0_b;      // [M, C], [M] mlp.fc0
    T fc1_w, fc1_b;      // [C, M], [C] mlp.fc1
};

template <class T>
struct VisionParts {
    T patch_w;  // [C, 3, p, p] patch_embed.proj.weight (used as [C, 3·p·p])
    T patch_b;  // [C]
    T pos_emb;  // [S, S, C] patch_embed.pos_emb.weight
    std::vector<VisionBlockParts<T>> blocks;  // [n_layer]
    T final_w, final_b;                       // [C] encoder.final_layernorm
    T proj_norm_w, proj_norm_b;               // [C] multi_modal_projector.pre_norm
    T linear_1_w, linear_1_b;                 // [m²C, m²C], [m²C]
    T linear_2_w, linear_2_b;                 // [d, m²C], [d]
};

using VisionBlockWeights = VisionBlockParts<Buffer>;
using VisionWeights = VisionParts<Buffer>;

// The tower's and projector's tensors with their full HF names (whole on every rank), filling w
// (null: the shapes alone, model/tensor_list.h).
TensorList vision_tensors(const ModelConfig& cfg, VisionWeights* w);
inline TensorList vision_tensors(const ModelConfig& cfg, VisionWeights& w) {
    return vision_tensors(cfg, &w);
}

// One image as the encoder takes it.
struct VisionImage {
    int64_t grid_h = 0, grid_w = 0;  // patches; multiples of merge·pool
    const float* pixels = nullptr;   // [3, grid_h·p, grid_w·p] normalised
};

// Patches of every image: Σ grid_h · grid_w.
int64_t total_patches(const std::vector<VisionImage>& images);

// Image tokens of one image: (grid_h/(pool·m)) · (grid_w/(pool·m)).
int64_t vision_tokens(const VisionConfig& v, int64_t grid_h, int64_t grid_w, int pool);
// Image tokens of a batch: Σ vision_tokens; fails unless every grid is a positive multiple of
// merge·pool (what vision_forward takes).
int64_t checked_vision_tokens(const VisionConfig& v,
                              const std::vector<VisionImage>& images,
                              int pool);

// patches [Σ h·w, 3·p·p]: every image's patches, image after image, row-major over its grid.
void patchify(const VisionConfig& v, const std::vector<VisionImage>& images, Tensor& patches);
// x [n, C] += bicubic(pos_emb → [h, w]) for one image of n = h·w patches.
void add_position_embedding(
    const VisionConfig& v, const VisionWeights& w, int64_t grid_h, int64_t grid_w, Tensor& x);
// The 2-D RoPE of model-math §8 (ops::rope_2d), in place, on n tokens of one image of grid width w
// (patch t at row t / w, column t mod w): x points at head 0 of token 0, heads head_dim apart,
// tokens token_stride apart.
void rope_2d(
    float* x, int64_t n, int64_t n_head, int64_t head_dim, int64_t token_stride, int64_t grid_w);
// One ViT block on x [Σ h·w, C] in place; images' grids give the attention blocks.
void vision_block(const VisionConfig& v,
                  const VisionBlockWeights& w,
                  const std::vector<VisionImage>& images,
                  Tensor& x);
// Mean over pool×pool cells: x [Σ h·w, C] → out [Σ h·w / pool², C] (pool = 1 copies). This and
// patch_merge are ops::gather_mean_rows of pool_merge_rows (model/vision_plan.h), which the
// forward runs as one gather.
void vision_pool(const std::vector<VisionImage>& images, int pool, const Tensor& x, Tensor& out);
// Patch merger: x [Σ h·w, C] (grids of images, already pooled) → out [Σ h·w / m², m²·C].
void patch_merge(
    const std::vector<VisionImage>& images, int pool, int merge, const Tensor& x, Tensor& out);
// Projector on merged rows [n, m²C] (LN per C-wide patch slot, linear_1, GELU, linear_2) →
// out [n, d].
void vision_project(const VisionConfig& v,
                    const VisionWeights& w,
                    const Tensor& merged,
                    Tensor& out);

// What the encoder did, summed over calls (profile.h5 /vision/*).
struct VisionStats {
    int64_t images = 0, patches = 0, tokens = 0;
    double seconds = 0;
    double flops = 0;            // GEMM FLOPs
    int64_t peak_act_bytes = 0;  // the largest call's activation buffers
};

// out [Σ vision_tokens, d] (host): every image's tokens, image after image, in one pass.
void vision_forward(const ModelConfig& cfg,
                    const VisionWeights& w,
                    const std::vector<VisionImage>& images,
                    int pool,
                    Tensor& out,
                    VisionStats* stats = nullptr);

}  // namespace hymoe::model
