// The GPU MoE layer over an expert-parallel group (tp = pp = 1, ep > 1): model::
// moe_forward_parallel on the device's Ctx over the ep comm (model/moe_parallel.h: each rank
// routes its own rows, sends each token once to every ep rank hosting one of its kept experts,
// runs its hosted experts on the rows it receives and returns each row's partial, which the owner
// adds in ascending source rank). The rows and partials go over NCCL, blocking (each all-to-all
// waits for the compute stream), so `overlap` cuts the rows in two micro-batches without
// hiding communication. Defined in device_ffn.cpp.
#pragma once

#include "device_blocks.h"
#include "hymoe/parallel/comm.h"

namespace hymoe::model::gpu {

class MoeEp {
public:
    // ep: the group the MoE layers dispatch over (every rank calls forward for every MoE layer
    // of every step, also with no rows); overlap: two micro-batches (MoeParallel::overlap); the
    // third argument (the fused kernels) is unused: over ep the routing is always the host's.
    MoeEp(const comm::Comm& ep, bool overlap, bool fused);
    int size() const { return ep_.size(); }
    // model::moe_forward over the group on x [n, d] f32 (n ≥ 0) into y [n, d] f32, w holding the
    // hosted experts only ([E_local, ·, ·], ids ascending, placement w.host.expert_rank).
    // Collective over ep.
    void forward(Gpu& g,
                 const ModelConfig& cfg,
                 const LayerSpec& spec,
                 const MoeW& w,
                 const Tensor& x,
                 DType cd,
                 Tensor& y,
                 MoeCommStats& stats);

private:
    const comm::Comm& ep_;
    bool overlap_;
};

}  // namespace hymoe::model::gpu
