// The whole model on one NVIDIA GPU (a model::DeviceModel): weights uploaded once, matrices in
// bf16 or fp32 (fp32 accumulation either way) and norm weights, biases, gates and the router in
// fp32; the residual stream, norms, KDA state, attention scores and softmax, MoE combine and
// logits in fp32. The forward runs the CPU blocks' math (model/kda.h, attention.h, ffn.h) on the
// ops of hymoe/backend/cuda_ops.h and cuda_model_ops.h:
//   - KDA: the q|k|v projection in one GEMM, the causal conv and the recurrence over the whole
//     packed batch in one launch each, every sequence's state [H, K, V] and conv tail on the
//     device;
//   - MLA/DSA: the absorbed (MQA) form over the cached latent [c_kv | k_r] in the device pages;
//     DSA with fused kernels and bf16 matrices at widths they take (model/fused_step.h): every
//     row of the step in one fused indexer top-k and one sparse MLA launch over the pages;
//     otherwise prefill chunks per sequence (scores by GEMM, causal softmax, DSA mask from the
//     indexer's top-k) and single-token rows of every sequence in one paged decode launch (DSA:
//     the top-k of the indexer's scores read from the pages);
//   - MoE: router logits on the device, the routing itself (top-k, groups, capacity) on the host
//     with the CPU's code (one device-to-host copy of [n_tok, E] logits a layer), then permute,
//     grouped expert GEMMs and the slot-ordered combine on the device.
// Layout: the whole model on one rank (tp = pp = ep = 1; dp replicas each hold their own copy).
// ForwardOptions::kda_mode, attn_mode and stage_out do not apply (one form of each block, one
// stage); with ForwardOptions::stats, each layer is timed between two stream synchronisations.
// The vision tower runs on the device too (src/model/cuda/device_vision.h: the encoder's GEMMs
// in the matrices' dtype, the rest fp32; patchify and the position tables on the host); LoRA
// adapters are not on the device. make_cuda_model exists in CUDA builds only (src/model/cuda/);
// the header is plain C++.
#pragma once

#include <memory>

#include "hymoe/core/types.h"
#include "hymoe/model/device_model.h"
#include "hymoe/model/model.h"

namespace hymoe::model {

struct CudaModelOptions {
    DType dtype = DType::bf16;     // the matrices on the device: bf16 or f32
    int max_tokens = 8192;         // rows of the largest step (workspace kept free for it)
    int max_seqs = 64;             // sequences running at once (their KDA states kept room for)
    bool logits_all = false;       // steps may ask for every row's logits (prompt logprobs)
    double memory_fraction = 0.9;  // of the device's free memory taken for the arena
    // The fused kernels (backend/cuda_fused.h) where their constraints hold, the generic ops
    // otherwise; false: the generic ops throughout (for comparison).
    bool fused = true;
    // Bytes of activations a pass of the vision encoder may hold (images are encoded in passes
    // under it); 0: the room a step of max_tokens keeps free.
    int64_t vision_scratch_bytes = 0;
};

// Uploads `host` (a whole model: make_model(cfg) with its weights) to the current device
// (backend::select_device has chosen it). The host model may be freed afterwards.
std::unique_ptr<DeviceModel> make_cuda_model(const Model& host, const CudaModelOptions& options);

}  // namespace hymoe::model
