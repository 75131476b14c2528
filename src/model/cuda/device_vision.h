// The vision tower on the GPU model's device (CUDA builds only): model::vision_forward's math
// (model/vision.h, model-math §8) with the weights uploaded once, matrices in the compute dtype
// `cd` (fp32 accumulation), norms and biases in fp32, and every activation in fp32 (cast to cd
// just before the GEMM that reads it). Patchify and the bicubic position tables (cached by grid)
// stay on the host, which uploads the patches; the attention of each image runs over its own
// patches only, heads as many at once as the scratch budget allows.
#pragma once

#include <cstdint>
#include <vector>

#include "device_blocks.h"
#include "hymoe/backend/cuda_vision.h"
#include "hymoe/model/vision.h"
#include "hymoe/model/vision_plan.h"

namespace hymoe::model::gpu {

struct VisionBlockW {
    Tensor norm0_w, norm0_b;  // [C]
    Tensor wqkv;              // [3C, C] cd: rows [q heads | k heads | v heads]
    Tensor wqkv_b;            // [3C]
    Tensor wo, wo_b;          // [C, C] cd, [C]
    Tensor norm1_w, norm1_b;  // [C]
    Tensor fc0, fc0_b;        // [M, C] cd, [M]
    Tensor fc1, fc1_b;        // [C, M] cd, [C]
};

class DeviceVision {
public:
    // Uploads `host` (cfg.vision.present) into g's arena for good.
    DeviceVision(Gpu& g, const ModelConfig& cfg, const VisionWeights& host, DType cd);

    // model::vision_forward(cfg, host, images, pool, out, stats) on the device: out [Σ
    // vision_tokens, d] f32 on the host. Images go in passes (model::vision_passes) whose
    // activations stay within scratch_bytes where an image alone allows it.
    void encode(const std::vector<VisionImage>& images,
                int pool,
                int64_t scratch_bytes,
                Tensor& out,
                VisionStats* stats);

private:
    // One pass: out [its tokens, d] f32 on the host; returns the bytes of activations it held.
    int64_t encode_pass(const std::vector<VisionImage>& images,
                        int pool,
                        int64_t scratch_bytes,
                        float* out);
    // x [n, C] ← x + ViT block(x) (model::vision_block); rope_pos [n, 2] int32 (patch_positions);
    // scores: room for the attention of heads_at_once heads of each image.
    void block(const VisionBlockW& w,
               const std::vector<VisionImage>& images,
               const Tensor& rope_pos,
               Tensor& scores,
               int64_t scores_bytes,
               Tensor& x);
    // o [n, C] = each image's attention over its own patches, head by head, from qkv [n, 3C] f32
    // (q and k already turned).
    void attention(const std::vector<VisionImage>& images,
                   const Tensor& qkv,
                   Tensor& scores,
                   int64_t scores_bytes,
                   Tensor& o);
    // y [n, out] f32 = act(x · wᵀ + b), x cast to w's dtype in s first.
    void linear(Scratch& s,
                const Tensor& x,
                const Tensor& w,
                const Tensor& b,
                backend::cuda::BiasAct act,
                Tensor& y);
    // Bytes of activations a patch of a pass holds at the widest point, scores aside.
    int64_t row_bytes() const;

    Gpu& g_;
    VisionConfig v_;
    int64_t d_ = 0;  // the language model's width
    DType cd_;
    Tensor patch_w_, patch_b_;          // [C, 3·p·p] cd, [C]
    std::vector<VisionBlockW> blocks_;  // [n_layer]
    Tensor final_w_, final_b_;          // [C]
    Tensor proj_norm_w_, proj_norm_b_;  // [C]
    Tensor linear_1_, linear_1_b_;      // [m²C, m²C] cd, [m²C]
    Tensor linear_2_, linear_2_b_;      // [d, m²C] cd, [d]
    PositionTables positions_;
    double flops_ = 0;  // GEMM FLOPs of the current encode call
};

}  // namespace hymoe::model::gpu
