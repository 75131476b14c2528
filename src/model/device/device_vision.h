// The vision tower on the model's device: the weights uploaded once by walking vision_tensors'
// list (matrices in the compute dtype `cd`, fp32 accumulation; norms and biases in fp32; the
// position table stays on the host, its bicubic tables cached by grid), then the one vision
// forward (model/vision_views.h) on the device's Ctx.
#pragma once

#include <cstdint>
#include <vector>

#include "device_runtime.h"
#include "hymoe/model/vision.h"
#include "hymoe/model/vision_plan.h"
#include "hymoe/model/vision_views.h"

namespace hymoe::model::dev {

class DeviceVision {
public:
    // Uploads `host` (cfg.vision.present) to ctx's device, kept in keep.
    DeviceVision(const backend::Ctx& ctx,
                 Keep& keep,
                 const ModelConfig& cfg,
                 const VisionWeights& host,
                 DType cd);

    // model::vision_forward(cfg, host, images, pool, out, stats) on the device: out [Σ
    // vision_tokens, d] f32 on the host. Images go in passes (model::vision_passes) whose
    // activations stay within scratch_bytes where an image alone allows it.
    void encode(const std::vector<VisionImage>& images,
                int pool,
                int64_t scratch_bytes,
                Tensor& out,
                VisionStats* stats);

private:
    const backend::Ctx& ctx_;
    ModelConfig cfg_;
    VisionWeightViews w_;  // device copies (pos_emb empty: positions_ holds it)
    PositionTables positions_;
};

}  // namespace hymoe::model::dev
