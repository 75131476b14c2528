// The GPU MoE layer over an expert-parallel group (tp = pp = 1, ep > 1): each rank routes its own
// rows, sends each token once to every ep rank hosting one of its kept experts (NCCL all-to-all-v
// on a communication stream), runs its hosted experts on the rows it receives (grouped GEMMs)
// and returns each row's slot-ordered fp32 partial, which the owner adds in ascending source
// rank. The host plans each micro-batch (model/moe_ep_plan.h, the CPU pipeline's order); with
// overlap the rows are cut in two micro-batches so that micro-batch 2's dispatch runs while
// micro-batch 1's experts compute, and micro-batch 1's combine while micro-batch 2's experts do.
#pragma once

#include <cstdint>

#include "device_blocks.h"
#include "hymoe/backend/cuda_async.h"
#include "hymoe/parallel/comm.h"

namespace hymoe::model::gpu {

class MoeEp {
public:
    // ep: the group the MoE layers dispatch over (every rank calls forward for every MoE layer
    // of every step, also with no rows); overlap: two micro-batches on two streams; fused: route
    // on the device where the one-rank model would (CudaModelOptions::fused).
    MoeEp(const comm::Comm& ep, bool overlap, bool fused);
    int size() const { return ep_.size(); }
    // model::moe_forward over the group on x [n, d] f32 (n ≥ 0) into y [n, d] f32, w holding the
    // hosted experts only ([E_local, ·, ·], ids ascending, placement w.host.expert_rank). The
    // routing is the one-rank model's (the fused route kernel where moe_runs_fused holds, else
    // router.h on the host from the device's logits), downloaded with one synchronisation a
    // layer, which also sizes the exchange; the counts and the rows' expert ids
    // and weights go over MPI (host), the rows and their partials over NCCL. Collective over ep.
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
    bool overlap_, fused_;
    cu::Stream comm_;       // the all-to-alls
    cu::Event sent_ready_;  // every micro-batch's rows gathered (compute stream)
    cu::Event dispatched_[2], computed_[2], combined_[2];
};

}  // namespace hymoe::model::gpu
