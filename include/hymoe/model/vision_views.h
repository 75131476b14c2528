// The one vision forward (model/vision.h's math, model-math §8) on tensor views, as ops on a Ctx
// (backend/ops_vision.h): the CPU's vision_forward calls it on its host Buffers' views, the GPU
// model (src/model/device/device_vision.h) on its uploaded copies. Both views come from walking
// vision_tensors' list. Patchify and the bicubic position tables stay on the host (PositionTables,
// model/vision_plan.h); the patches and positions are uploaded, the tokens copied back.
// Invariant: every view of one call lives on ctx.device (pos_emb aside: host only, may be empty).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "hymoe/backend/ctx.h"
#include "hymoe/model/config.h"
#include "hymoe/model/vision.h"
#include "hymoe/model/vision_plan.h"
#include "hymoe/tensor/tensor.h"

namespace hymoe::model {

using VisionBlockViews = VisionBlockParts<Tensor>;
using VisionWeightViews = VisionParts<Tensor>;

// The views of `tensors`, given in vision_tensors(cfg) order (host views, or their device copies)
// at the list's shapes.
VisionWeightViews vision_views(const ModelConfig& cfg, const std::vector<Tensor>& tensors);
// Every tensor of host, in vision_tensors(cfg) order.
std::vector<const Buffer*> vision_list(const ModelConfig& cfg, const VisionWeights& host);
// host's views (vision_views of vision_list's views).
VisionWeightViews vision_views(const ModelConfig& cfg, const VisionWeights& host);
// The views of f(spec, buffer) for every tensor of host in vision_tensors(cfg) order, spec its
// entry in the unbound list (name, shape, init): a device's copies.
VisionWeightViews vision_views(
    const ModelConfig& cfg,
    const VisionWeights& host,
    const std::function<Tensor(const TensorSpec& spec, const Buffer& buffer)>& f);
// One block's views.
VisionBlockViews vision_block_views(const VisionConfig& v, const VisionBlockWeights& host);

// A scratch budget that never splits a batch (the CPU's: one pass, activations as they come).
constexpr int64_t kVisionNoBudget = int64_t{1} << 50;

// x [n, C] += ViT block(x) for packed images of `lengths` patches (Σ = n); rope_pos [n, 2] i32
// (patch_positions) on ctx's device; scores_bytes: room for the attention's scores
// (ops::vision_attention). Adds its GEMM FLOPs to *flops.
void vision_block(const backend::Ctx& ctx,
                  const VisionConfig& v,
                  const VisionBlockViews& w,
                  const std::vector<int64_t>& lengths,
                  const Tensor& rope_pos,
                  int64_t scores_bytes,
                  Tensor& x,
                  double* flops);
// The projector on merged rows [n, m²C] (overwritten by their per-slot LayerNorm) → out [n, d].
// Adds its GEMM FLOPs to *flops.
void vision_project(const backend::Ctx& ctx,
                    const VisionConfig& v,
                    const VisionWeightViews& w,
                    Tensor& merged,
                    Tensor& out,
                    double* flops);

// out [Σ vision_tokens, d] f32 on the host: every image's tokens, image after image, the images
// in passes (vision_passes) whose activations stay within scratch_bytes where an image alone
// allows it, each pass's attention heads as many at once as the rest allows. stats (if given)
// gets the call's figures.
void vision_forward(const backend::Ctx& ctx,
                    const ModelConfig& cfg,
                    const VisionWeightViews& w,
                    PositionTables& positions,
                    const std::vector<VisionImage>& images,
                    int pool,
                    int64_t scratch_bytes,
                    Tensor& out,
                    VisionStats* stats = nullptr);

}  // namespace hymoe::model
