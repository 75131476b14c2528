// The MoE layer on the GPU (device_blocks.h). Generic: model::moe_forward_parallel, the CPU's
// own forward, on the device's Ctx (router logits on the device, routing on the host by the CPU's
// code, the grouped experts on the device), with groups of one (moe_block) or over the rank's tp
// and ep groups (the caller, device_forward.cpp). Fused (bf16 SwiGLU experts, dropless, one rank):
// routing by ops::moe_route on the device, then the dispatch plan, grouped experts and combine in
// the fused kernels (cuda_fused.h), with no host round trip; its shared experts are
// model::dense_ffn_forward on the device's Ctx.
#include <utility>
#include <vector>

#include "../route_rule.h"
#include "device_blocks.h"
#include "hymoe/backend/cuda_fused.h"
#include "hymoe/backend/cuda_ops.h"
#include "hymoe/backend/moe_route.h"
#include "hymoe/core/error.h"
#include "hymoe/model/batch.h"
#include "hymoe/model/decode_graph_plan.h"

namespace hymoe::model::gpu {

void route_on_device(Gpu& g,
                     const ModelConfig& cfg,
                     const MoeW& w,
                     const Tensor& logits,
                     Tensor& idx,
                     Tensor& weight) {
    const Tensor bias = cfg.moe.correction_bias ? w.bias : Tensor{};
    Tensor scores = logits;  // the CUDA form leaves it alone
    ops::moe_route(ctx_of(g), detail::route_rule(cfg), scores, bias, idx, weight);
}

namespace {

// The fused routed experts (cuda_fused.h) of z [n, w] bf16 into acc [n, w] f32 with routing on the
// device from logits [n, E]: route → dispatch plan → grouped SwiGLU experts → slot-ordered combine.
// Returns the expert load when count_load (one download of the plan's offsets), else nothing.
std::vector<int64_t> routed_fused(Gpu& g,
                                  const ModelConfig& cfg,
                                  const MoeW& w,
                                  const cu::MoePlan& plan,
                                  const Tensor& logits,
                                  const Tensor& z,
                                  bool count_load,
                                  Tensor& acc) {
    const MoeConfig& m = cfg.moe;
    const int64_t n = z.dim(0), k = m.top_k, n_exp = m.n_routed_experts, inter = w.up.dim(1);
    Scratch s(g.arena);
    Tensor idx = s(DType::i32, {n, k});     // [n, k] expert of each slot, best first
    Tensor weight = s(DType::f32, {n, k});  // [n, k]
    route_on_device(g, cfg, w, logits, idx, weight);

    Tensor scratch = s(DType::i32, {(plan.scratch_bytes + 3) / 4});
    const cu::MoeDispatch d = cu::moe_dispatch_arrays(
        plan, static_cast<int>(n), static_cast<int>(k), static_cast<int>(n_exp), scratch.data);
    cu::moe_dispatch_plan(g.stream, plan, idx.ptr<int32_t>(), d);
    Tensor h = s(DType::bf16, {n * k, inter});       // [n_assign, I]
    Tensor out = s(DType::bf16, {n * k, z.dim(1)});  // [n_assign, w]
    cu::MoeExpertParams ep;
    ep.d = static_cast<int>(z.dim(1));
    ep.inter = static_cast<int>(inter);
    ep.x = z.data;
    ep.w1 = w.gate.data;
    ep.w3 = w.up.data;
    ep.w2 = w.down.data;
    ep.h = h.data;
    ep.out = out.data;
    cu::moe_experts(g.stream, plan, d, ep);
    cu::moe_combine(g.stream, d, out.data, weight.ptr<float>(), ep.d, DType::f32, acc.data, false);
    if (!count_load)
        return {};
    std::vector<int32_t> offset(static_cast<size_t>(n_exp) + 1);
    cu::copy_to_host(offset.data(), d.offset, offset.size() * sizeof(int32_t), g.stream);
    g.stream.synchronize();
    std::vector<int64_t> load(static_cast<size_t>(n_exp));
    for (size_t e = 0; e < load.size(); ++e)
        load[e] = offset[e + 1] - offset[e];
    return load;
}

}  // namespace

MoeWeightViews moe_views_of(const MoeW& w, DType cd, int64_t n_exp, const comm::Comm* ep) {
    MoeWeightViews v = w;
    v.host_bias = w.host.correction_bias.view();
    v.expert_rank = w.host.expert_rank;
    if (ep != nullptr)
        v.expert_slot = local_expert_index(w.host.expert_rank, n_exp, ep->size(), ep->rank());
    v.act = cd;
    return v;
}

void moe_block(Gpu& g,
               const ModelConfig& cfg,
               const LayerSpec& spec,
               const MoeW& w,
               const Tensor& x,
               DType cd,
               bool fused,
               bool count_load,
               Tensor& y,
               MoeCommStats& stats,
               const LoraStep* lora,
               const MoeParallel& par) {
    const MoeConfig& m = cfg.moe;
    const int64_t n = x.dim(0), n_exp = m.n_routed_experts;
    const bool has_rows = lora != nullptr && !lora->rows.empty();
    const bool expert_lora = has_rows && !w.experts.lora_views.empty();  // routes on the host
    const bool one_rank = par.tp == nullptr && par.ep == nullptr;
    if (!one_rank || expert_lora || !moe_runs_fused(cfg, spec, cd, fused, n)) {
        // a model with adapters in a step none of whose rows uses one: every row the base
        // model's (−1), not adapter 0 (moe_forward_parallel's choice without rows)
        const bool base_rows = !has_rows && lora != nullptr && lora->n_adapters > 0;
        const SeqBatch rows = has_rows ? single_rows(lora->row_adapter)
                              : base_rows
                                  ? single_rows(std::vector<int>(static_cast<size_t>(n), -1))
                                  : SeqBatch();
        moe_forward_parallel(ctx_of(g),
                             cfg,
                             spec,
                             moe_views_of(w, cd, n_exp, par.ep),
                             x,
                             y,
                             par,
                             &stats,
                             has_rows || base_rows ? &rows : nullptr,
                             nullptr,
                             has_rows ? &lora->rows : nullptr);
        return;
    }

    const bool latent = spec.ffn == Ffn::latent_moe;
    const int64_t width = latent ? m.latent_size : cfg.hidden_size;
    Scratch s(g.arena);
    Tensor logits = s(DType::f32, {n, n_exp});  // [n, E] fp32 router logits
    ops::router_logits(ctx_of(g), x, w.router, logits);
    const Tensor xc = in_dtype(g, s, x, cd);
    Tensor z = xc;  // [n, w] the experts' input
    if (latent) {
        z = s(cd, {n, width});
        g.blas.linear(xc, w.fc1, z);
    }
    Tensor y_lat;  // [n, ℓ] (latent)
    Tensor& acc = latent ? (y_lat = s(DType::f32, {n, width})) : y;
    const cu::MoePlan plan = cu::moe_plan(n, m.top_k, n_exp, width, w.up.dim(1));
    std::vector<int64_t> load = routed_fused(g, cfg, w, plan, logits, z, count_load, acc);
    if (latent)
        g.blas.linear(in_dtype(g, s, y_lat, cd), w.fc2, y);
    if (m.n_shared_experts > 0) {                             // y += Shared(x)
        Tensor shared = s(DType::f32, {n, cfg.hidden_size});  // [n, d]
        dense_ffn_forward(ctx_of(g),
                          w.shared,
                          m.expert_act,
                          xc,
                          shared,
                          nullptr,
                          has_rows ? &lora->rows : nullptr);
        cu::add_inplace(g.stream, y, shared);
    }

    MoeCommStats one;  // the fused one-rank MoE: only its expert load
    one.calls = 1;
    one.tokens_per_expert = std::move(load);
    stats.add(one);
}

}  // namespace hymoe::model::gpu
