// The model's weights on this rank's GPU for a pass that keeps no KV pages or step tables (LoRA
// training, model/train.h TrainOn): a device context of its own (stream, arena, BLAS handle) and
// every weight of the rank's part uploaded once from the host model's list (the matrices in
// `dtype`, the routed experts this rank hosts stacked per layer, as the GPU model uploads them),
// seen as the weight views with the MoE layers' host side of the routing and no adapters. The
// rest of the arena (arena_bytes: the job's share of the GPU, runtime/device_choice.h) is the
// passes' scratch and the tensors they keep. make_gpu_weights exists in CUDA builds only
// (src/model/cuda/); the header is plain C++.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "hymoe/backend/ctx.h"
#include "hymoe/model/model_views.h"

namespace hymoe::model {

class GpuWeights {
public:
    virtual ~GpuWeights() = default;
    virtual const backend::Ctx& ctx() const = 0;
    virtual const ModelViews& views() const = 0;
    virtual int64_t weight_bytes() const = 0;  // the uploaded weights' device memory
};

// host: this rank's part (make_model with the grid, weights loaded); it must outlive the result.
// dtype: f32 or bf16. arena_bytes: the device memory taken, weights included.
std::unique_ptr<GpuWeights> make_gpu_weights(const Model& host, DType dtype, size_t arena_bytes);

}  // namespace hymoe::model
