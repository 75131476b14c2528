// The vision encoder of the model on a device (device_vision.h): the upload, then
// model::vision_forward on the device's context.
#include "device_vision.h"

#include "hymoe/backend/cuda_vision.h"
#include "hymoe/core/error.h"

namespace hymoe::model::dev {

namespace {

constexpr int64_t kPositionCacheBytes = int64_t{256} << 20;  // host position tables kept

}  // namespace

DeviceVision::DeviceVision(const backend::Ctx& ctx,
                           Keep& keep,
                           const ModelConfig& cfg,
                           const VisionWeights& host,
                           DType cd)
    : ctx_(ctx), cfg_(cfg), positions_(cfg.vision, host, kPositionCacheBytes) {
    const VisionConfig& v = cfg.vision;
    HYMOE_CHECK(ctx.device == Device::cpu ||
                    (v.n_head > 0 && v.width % v.n_head == 0 && (v.width / v.n_head) % 4 == 0 &&
                     v.width / v.n_head <= 4 * backend::cuda::kMaxRope2dFreqs),
                "GPU vision tower: width ",
                v.width,
                " over ",
                v.n_head,
                " heads (head width a multiple of 4, at most ",
                4 * backend::cuda::kMaxRope2dFreqs,
                ")");
    // matrices (and the patch kernel) in cd, the rest in f32; the position table stays here
    w_ = vision_views(cfg, host, [&](const TensorSpec& spec, const Buffer& b) {
        if (&b == &host.pos_emb)
            return Tensor{};
        return upload_weight(ctx, keep, b, spec.init == Init::normal ? cd : DType::f32);
    });
}

void DeviceVision::encode(const std::vector<VisionImage>& images,
                          int pool,
                          int64_t scratch_bytes,
                          Tensor& out,
                          VisionStats* stats) {
    vision_forward(ctx_, cfg_, w_, positions_, images, pool, scratch_bytes, out, stats);
}

}  // namespace hymoe::model::dev
