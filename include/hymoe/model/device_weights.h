// The model's weights on this rank's device for a pass that keeps no KV pages or step tables (LoRA
// training on a GPU, model/train.h TrainOn): a device context of its own (backend/owned_ctx.h:
// stream, arena, BLAS handle) and every weight of the rank's part uploaded once from the host
// model's list (the matrices in `dtype`, the routed experts this rank hosts stacked per layer, as
// the model on a device uploads them: model/device_model.h), seen as the weight views with the
// MoE layers' host side of the routing and no adapters. On a GPU the rest of the arena
// (arena_bytes: the job's share of the GPU, runtime/device_choice.h) is the passes' scratch and
// the tensors they keep; on the CPU (the tests' twin of the GPU trainer) the copies are host
// memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "hymoe/backend/ctx.h"
#include "hymoe/model/model_views.h"

namespace hymoe::model {

class DeviceWeights {
public:
    virtual ~DeviceWeights() = default;
    virtual const backend::Ctx& ctx() const = 0;
    virtual const ModelViews& views() const = 0;
    virtual int64_t weight_bytes() const = 0;  // the uploaded weights' device memory
};

// host: this rank's part (make_model with the grid, weights loaded); it must outlive the result.
// dtype: f32 or bf16. arena_bytes: the device memory taken, weights included.
std::unique_ptr<DeviceWeights> make_device_weights(const Model& host,
                                                   Device device,
                                                   DType dtype,
                                                   size_t arena_bytes);

}  // namespace hymoe::model
