// The model's weights on a device for LoRA training (model/device_weights.h): the upload of the
// model on a device (device_weights.cpp) and its MoE views (moe_views_of), without its step
// runtime.
#include <algorithm>
#include <memory>

#include "device_runtime.h"
#include "hymoe/backend/owned_ctx.h"
#include "hymoe/core/error.h"
#include "hymoe/model/device_weights.h"
#include "hymoe/model/model.h"
#include "hymoe/parallel/comms.h"

namespace hymoe::model {

namespace {

class TrainWeights final : public DeviceWeights {
public:
    TrainWeights(const Model& host, Device device, DType dtype, size_t arena_bytes)
        : owned_(device, arena_bytes, std::max(host.cfg.moe.n_routed_experts, 1)) {
        HYMOE_CHECK(dtype == DType::f32 || dtype == DType::bf16,
                    "make_device_weights: matrices in ",
                    to_string(dtype),
                    " (f32 or bf16)");
        views_ = model_views(host, dev::upload_weights(ctx(), keep_, host, dtype));
        const comm::Comm* ep = host.shard.ep > 1 ? &host.comms->ep : nullptr;
        moe_.resize(host.cfg.layers.size());
        for (int i = host.shard.first_layer; i < host.shard.end_layer; ++i) {
            if (host.cfg.layers[i].ffn == Ffn::dense)
                continue;
            moe_[i] = dev::moe_weights(views_.layers[i].moe, host.layers[i].moe);
            // the experts read the pass's f32 activations whatever the matrices' dtype
            views_.layers[i].moe =
                dev::moe_views_of(moe_[i], DType::f32, host.cfg.moe.n_routed_experts, ep);
        }
        bytes_ = static_cast<int64_t>(dev::kept_bytes(keep_));
    }
    const backend::Ctx& ctx() const override { return owned_.ctx(); }
    const ModelViews& views() const override { return views_; }
    int64_t weight_bytes() const override { return bytes_; }

private:
    backend::OwnedCtx owned_;
    dev::Keep keep_;  // the uploaded weights
    ModelViews views_;
    std::vector<dev::MoeW> moe_;  // [n_layer] the MoE layers' host side of the routing
    int64_t bytes_ = 0;
};

}  // namespace

std::unique_ptr<DeviceWeights> make_device_weights(const Model& host,
                                                   Device device,
                                                   DType dtype,
                                                   size_t arena_bytes) {
    return std::make_unique<TrainWeights>(host, device, dtype, arena_bytes);
}

}  // namespace hymoe::model
