// Many small tensors from a Ctx's device to the host with one wait (the LoRA trainer's factors and
// AdamW moments when a checkpoint or the adapters are written, its gradients in tests): the
// tensors packed into one scratch tensor on the device (copies queued on ctx's stream), one
// download, then unpacked on the host. CPU: plain copies.
#pragma once

#include <span>

#include "hymoe/backend/ctx.h"
#include "hymoe/tensor/tensor.h"

namespace hymoe::ops {

// hosts[i] ← srcs[i] (on ctx's device) for every i: one dtype for all, equal element counts
// pairwise; complete when this returns (CUDA: waits for the stream once).
void download_all(const backend::Ctx& ctx, std::span<const Tensor> srcs, std::span<Tensor> hosts);

}  // namespace hymoe::ops
