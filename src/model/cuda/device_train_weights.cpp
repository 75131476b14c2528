// The model's weights on the GPU for LoRA training (model/gpu_weights.h): the GPU model's upload
// (device_weights.cpp) and MoE views (moe_views_of), without its step runtime.
#include <algorithm>
#include <memory>

#include "device_blocks.h"
#include "hymoe/backend/cuda_model_ops.h"
#include "hymoe/core/error.h"
#include "hymoe/model/gpu_weights.h"
#include "hymoe/model/model.h"
#include "hymoe/parallel/comms.h"

namespace hymoe::model {

namespace {

class TrainWeights final : public GpuWeights {
public:
    TrainWeights(const Model& host, DType dtype, size_t arena_bytes)
        : g_(arena_bytes, std::max(host.cfg.moe.n_routed_experts, 1)), ctx_(gpu::ctx_of(g_)) {
        HYMOE_CHECK(dtype == DType::f32 || dtype == DType::bf16,
                    "make_gpu_weights: matrices in ",
                    to_string(dtype),
                    " (f32 or bf16)");
        const size_t before = g_.arena.book().used();
        views_ = model_views(host, gpu::upload_weights(g_, host, dtype));
        const comm::Comm* ep = host.shard.ep > 1 ? &host.comms->ep : nullptr;
        moe_.resize(host.cfg.layers.size());
        for (int i = host.shard.first_layer; i < host.shard.end_layer; ++i) {
            if (host.cfg.layers[i].ffn == Ffn::dense)
                continue;
            moe_[i] = gpu::moe_weights(views_.layers[i].moe, host.layers[i].moe);
            // the experts read the pass's f32 activations whatever the matrices' dtype
            views_.layers[i].moe =
                gpu::moe_views_of(moe_[i], DType::f32, host.cfg.moe.n_routed_experts, ep);
        }
        bytes_ = static_cast<int64_t>(g_.arena.book().used() - before);
    }
    const backend::Ctx& ctx() const override { return ctx_; }
    const ModelViews& views() const override { return views_; }
    int64_t weight_bytes() const override { return bytes_; }

private:
    gpu::Gpu g_;
    backend::Ctx ctx_;
    ModelViews views_;
    std::vector<gpu::MoeW> moe_;  // [n_layer] the MoE layers' host side of the routing
    int64_t bytes_ = 0;
};

}  // namespace

std::unique_ptr<GpuWeights> make_gpu_weights(const Model& host, DType dtype, size_t arena_bytes) {
    return std::make_unique<TrainWeights>(host, dtype, arena_bytes);
}

}  // namespace hymoe::model
