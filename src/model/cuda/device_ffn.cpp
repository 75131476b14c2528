// The MoE layer on the GPU (device_blocks.h) in model/moe.cpp's phases; its MLPs (the shared
// experts) are model::dense_ffn_forward on the device's Ctx. Router logits [n_tok, E] by
// ops::router_logits (one fp32 GEMM on the device). Generic: the logits copied to the host and
// routed there by the CPU's own code (router.h: scores, groups, top-k, weights, capacity), so the
// expert choice is the CPU's given the logits; then the CPU's grouped expert stage
// (moe_grouped.h: host plan, gather, grouped products, combine as Ctx ops) on the device. Fused
// (bf16 SwiGLU experts, dropless): routing by ops::moe_route on the device, then the dispatch
// plan, grouped experts and combine in the fused kernels (cuda_fused.h), with no host round trip.
// LoRA adapters (model/lora_views.h): a layer with routed-expert adapters routes on the host in a
// step that uses any, so that each expert's rows per adapter are known there.
#include <utility>
#include <vector>

#include "../moe_experts.h"
#include "../route_rule.h"
#include "../router.h"
#include "device_blocks.h"
#include "hymoe/backend/cuda_fused.h"
#include "hymoe/backend/cuda_ops.h"
#include "hymoe/backend/moe_route.h"
#include "hymoe/core/error.h"
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

// The routed experts with the routing on the host (router.h, given the device's logits [n, E]):
// z [n, w] in cd into acc [n, w] f32 by detail::experts_grouped on the device's Ctx (the expert
// groups planned on the host, the gather, grouped products and combine as Ctx ops, each expert's
// adapters on its rows per adapter). Returns the expert load.
std::vector<int64_t> routed_host(Gpu& g,
                                 const ModelConfig& cfg,
                                 const MoeW& w,
                                 const Tensor& logits,
                                 const Tensor& z,
                                 Tensor& acc,
                                 const LoraStep* lora) {
    const MoeConfig& m = cfg.moe;
    const int64_t n = z.dim(0), n_exp = m.n_routed_experts;
    Buffer scores(DType::f32, {n, n_exp});
    cu::download(logits, scores.view(), g.stream);
    g.stream.synchronize();
    detail::router_activate(cfg, scores.view());
    const Routing r = detail::route_scores(cfg, w.host, scores.view());
    const std::vector<int32_t> kept = detail::kept_experts(r);  // [n, k] −1: dropped
    const detail::RowSlots slots{
        kept.data(), r.weight.data(), n, m.top_k, lora ? lora->row_adapter.data() : nullptr};
    std::vector<int64_t> load(static_cast<size_t>(n_exp), 0);
    detail::experts_grouped(
        ctx_of(g), w.experts, m.expert_act, slots, z, acc, [] {}, load);
    return load;
}

}  // namespace

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
               const LoraStep* lora) {
    const MoeConfig& m = cfg.moe;
    const int64_t n = x.dim(0), n_exp = m.n_routed_experts;
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
    const bool has_rows = lora != nullptr && !lora->rows.empty();
    const bool expert_lora = has_rows && !w.experts.lora_views.empty();  // routes on the host
    const bool use_fused = !expert_lora && moe_runs_fused(cfg, spec, cd, fused, n);
    std::vector<int64_t> load =
        use_fused ? routed_fused(g, cfg, w, plan, logits, z, count_load, acc)
                  : routed_host(g, cfg, w, logits, z, acc, expert_lora ? lora : nullptr);
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

    MoeCommStats one;  // the one-rank MoE: only its expert load
    one.calls = 1;
    one.tokens_per_expert = std::move(load);
    stats.add(one);
}

}  // namespace hymoe::model::gpu
