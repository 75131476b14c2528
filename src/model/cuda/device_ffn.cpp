// The MoE layer on the GPU (device_blocks.h) in model/moe.cpp's phases; its MLPs (the shared
// experts) are model::dense_ffn_forward on the device's Ctx. Routing: the router logits [n_tok, E]
// are one fp32 GEMM on the device, copied to the host, and routed there by the CPU's own code
// (router.h: scores, groups, top-k, weights, capacity), so the expert choice is the CPU's given
// the logits. The expert groups are the CPU's plan (backend/moe_groups.h: each expert's kept
// tokens contiguous, in token order), uploaded as a row map; then the gather, the experts as
// grouped products (one launch per matrix for all experts), the activation and the slot-ordered
// combine into fp32 run as Ctx ops (backend/ops_moe.h). Fused (bf16 SwiGLU experts, dropless):
// the same phases in the fused kernels (cuda_fused.h), routing included, with no host round trip.
// LoRA adapters (model/lora_views.h): on the projections per adapter's rows; a layer with
// routed-expert adapters routes on the host in a step that uses any, so that each expert's rows
// per adapter are known there.
#include <utility>
#include <vector>

#include "../moe_experts.h"
#include "../route_rule.h"
#include "../router.h"
#include "device_blocks.h"
#include "hymoe/backend/cuda_fused.h"
#include "hymoe/backend/cuda_ops.h"
#include "hymoe/backend/moe_groups.h"
#include "hymoe/backend/moe_route.h"
#include "hymoe/backend/ops.h"
#include "hymoe/backend/ops_moe.h"
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

// The held experts' matrices [E, rows, cols] as one slice each, for ops::grouped_linear.
std::vector<Tensor> expert_slices(const Tensor& stacked) {
    const int64_t rows = stacked.dim(1), cols = stacked.dim(2);
    std::vector<Tensor> out;
    for (int64_t e = 0; e < stacked.dim(0); ++e)
        out.push_back(
            Tensor{at(stacked, e * rows * cols), stacked.dtype, Device::cuda, {rows, cols}});
    return out;
}

// The routed experts with the routing on the host (router.h, given the device's logits [n, E]):
// z [n, w] in cd into acc [n, w] f32. The expert groups are backend/moe_groups.h's plan (each
// expert's kept tokens contiguous, in token order), the gather, the grouped products and the
// slot-ordered combine the Ctx ops of backend/ops_moe.h, each expert's adapters
// model::lora_forward on its rows per adapter. Returns the expert load.
std::vector<int64_t> routed_host(Gpu& g,
                                 const ModelConfig& cfg,
                                 const MoeW& w,
                                 const Tensor& logits,
                                 const Tensor& z,
                                 Tensor& acc,
                                 const LoraStep* lora) {
    const MoeConfig& m = cfg.moe;
    const int64_t n = z.dim(0), k = m.top_k, n_exp = m.n_routed_experts, width = z.dim(1);
    const DType cd = z.dtype;
    const backend::Ctx ctx = ctx_of(g);
    Scratch s(g.arena);
    Buffer scores(DType::f32, {n, n_exp});
    cu::download(logits, scores.view(), g.stream);
    g.stream.synchronize();
    detail::router_activate(cfg, scores.view());
    Routing r = detail::route_scores(cfg, w.host, scores.view());
    const std::vector<int32_t> kept = detail::kept_experts(r);  // [n, k] −1: dropped
    const backend::MoeGroups groups = backend::moe_group_rows(kept.data(), n, k, n_exp);
    const std::vector<int64_t> counts = groups.rows_per_expert();
    const Tensor row_dev = upload_values(g, s, groups.row, DType::i64);
    const Tensor weight_dev = upload_values(g, s, r.weight, DType::f32);
    // the experts' adapters: each expert's grouped rows per adapter (lora_rows.h)
    const std::vector<std::vector<AdapterRowsW>> lora_rows =
        lora ? upload_lora_rows(
                   g,
                   s,
                   expert_adapter_rows(
                       groups.row, k, lora->row_adapter, groups.offset, lora->n_adapters),
                   n_exp)
             : std::vector<std::vector<AdapterRowsW>>();
    const SeqBatch none = single_sequence(0);  // no host adapters on the device
    // y += expert e's adapters (slot `which` of its MlpLoraW) on its rows of x, each adapted expert
    auto adapters = [&](LoraSlotW MlpLoraW::*which, const Tensor& x, Tensor& y) {
        for (size_t e = 0; e < lora_rows.size(); ++e)
            if (!lora_rows[e].empty())
                lora_forward(ctx, nullptr, w.expert_lora[e].*which, none, &lora_rows[e], x, y);
    };

    // experts on the kept rows, then the weighted sum in slot order (fp32)
    const int64_t n_rows = groups.n_rows(), inter = w.up.dim(1);
    Tensor in = s(cd, {n_rows, width});  // [n_rows, w] rows grouped by expert
    ops::moe_gather(ctx, z, row_dev, k, in);
    Tensor up = s(cd, {n_rows, inter});  // [n_rows, I]
    ops::grouped_linear(ctx, in, expert_slices(w.up), counts, up);
    adapters(&MlpLoraW::up, in, up);
    Tensor h = up;  // [n_rows, I] the activation
    if (m.expert_act == ExpertAct::swiglu) {
        h = s(cd, {n_rows, inter});
        ops::grouped_linear(ctx, in, expert_slices(w.gate), counts, h);
        adapters(&MlpLoraW::gate, in, h);
        ops::swiglu(ctx, h, up, h);
    } else {
        ops::relu2_inplace(ctx, up);
    }
    Tensor out = s(cd, {n_rows, width});  // [n_rows, w]
    ops::grouped_linear(ctx, h, expert_slices(w.down), counts, out);
    adapters(&MlpLoraW::down, h, out);
    ops::moe_combine(ctx, out, row_dev, weight_dev, k, acc);
    return std::move(r.tokens_per_expert);
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
    const bool expert_lora = has_rows && !w.expert_lora.empty();  // routes on the host
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
