// The FFN blocks on the GPU (device_blocks.h): the SwiGLU/relu2 MLP (dense layers and shared
// experts) and the MoE layer in model/moe.cpp's phases. Routing: the router logits [n_tok, E] are
// one fp32 GEMM on the device, copied to the host, and routed there by the CPU's own code
// (router.h: scores, groups, top-k, weights, capacity), so the expert choice is the CPU's given
// the logits. The host plans the dispatch exactly as moe.cpp (each expert's kept tokens
// contiguous, in token order) and uploads the row map and weights; then permute, the experts as
// grouped GEMMs (one launch per matrix for all experts), the activation and the slot-ordered
// combine into fp32 run on the device. Fused (bf16 SwiGLU experts, dropless): the same phases in
// the fused kernels (cuda_fused.h), routing included, with no host round trip. LoRA adapters
// (device_lora.h): on the MLPs' projections per adapter's rows; a layer with routed-expert
// adapters routes on the host in a step that uses any, so that each expert's rows per adapter
// are known there.
#include <utility>
#include <vector>

#include "../router.h"
#include "device_blocks.h"
#include "hymoe/backend/cuda_fused.h"
#include "hymoe/backend/cuda_ops.h"
#include "hymoe/core/error.h"
#include "hymoe/model/decode_graph_plan.h"

namespace hymoe::model::gpu {

namespace {

// act(gate, up) into gate (swiglu) or up (relu2); returns the activated tensor.
Tensor activate(Gpu& g, ExpertAct act, Tensor& gate, Tensor& up) {
    if (act == ExpertAct::swiglu) {
        cu::swiglu(g.stream, gate, up, gate);
        return gate;
    }
    cu::relu2_inplace(g.stream, up);
    return up;
}

}  // namespace

void mlp_block(Gpu& g,
               const MlpW& w,
               ExpertAct act,
               const Tensor& x,
               Tensor& y,
               float beta,
               const std::vector<AdapterRowsW>* lora_rows) {
    const int64_t n = x.dim(0), inter = w.up.dim(0);
    const std::vector<AdapterRowsW> none;
    const std::vector<AdapterRowsW>& rows = lora_rows ? *lora_rows : none;
    Scratch s(g.arena);
    Tensor up = s(x.dtype, {n, inter});  // [n, I]
    Tensor gate;                         // [n, I] (swiglu)
    g.blas.linear(x, w.up, up);
    lora_apply(g, w.lora.up, rows, x, up);
    if (act == ExpertAct::swiglu) {
        gate = s(x.dtype, {n, inter});
        g.blas.linear(x, w.gate, gate);
        lora_apply(g, w.lora.gate, rows, x, gate);
    }
    const Tensor h = activate(g, act, gate, up);  // [n, I]
    g.blas.linear(h, w.down, y, beta);
    lora_apply(g, w.lora.down, rows, h, y);
}

void route_on_device(Gpu& g,
                     const ModelConfig& cfg,
                     const MoeW& w,
                     const Tensor& logits,
                     Tensor& idx,
                     Tensor& weight) {
    const MoeConfig& m = cfg.moe;
    const int64_t n = logits.dim(0), k = m.top_k, n_exp = m.n_routed_experts;
    const detail::WeightRule rule = detail::weight_rule(cfg);
    cu::MoeRouteParams rp;
    rp.n_tok = static_cast<int>(n);
    rp.n_exp = static_cast<int>(n_exp);
    rp.top_k = static_cast<int>(k);
    rp.n_group = m.n_group;
    rp.topk_group = m.topk_group;
    rp.softmax = m.scoring == Scoring::softmax;
    rp.renormalize = rule.renormalize;
    rp.renorm_eps = rule.eps;
    rp.scale = rule.rho;
    rp.weights_from_biased = m.weights_from_biased_scores;
    if (cfg.model_type == "kimi_linear")  // the masked groups' scores (router.cpp mask_groups)
        rp.group_fill = 0.0f;
    rp.logits = logits.ptr<float>();
    rp.bias = m.correction_bias ? w.bias.ptr<float>() : nullptr;
    rp.idx = idx.ptr<int32_t>();
    rp.weight = weight.ptr<float>();
    cu::moe_route(g.stream, rp);
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
// z [n, w] in cd into acc [n, w] f32. Returns the expert load.
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
    Scratch s(g.arena);
    Buffer scores(DType::f32, {n, n_exp});
    cu::download(logits, scores.view(), g.stream);
    g.stream.synchronize();
    detail::router_activate(cfg, scores.view());
    Routing r = detail::route_scores(cfg, w.host, scores.view());

    // dispatch plan (moe.cpp): expert e owns rows [offset[e], offset[e+1]), its tokens ascending
    std::vector<int64_t> offset(static_cast<size_t>(n_exp) + 1, 0);
    for (int64_t e = 0; e < n_exp; ++e)
        offset[e + 1] = offset[e] + r.tokens_per_expert[e];
    std::vector<int64_t> cursor(offset.begin(), offset.end() - 1);
    std::vector<int64_t> row(static_cast<size_t>(n * k), -1);  // [n, k] grouped row, −1 dropped
    for (size_t a = 0; a < row.size(); ++a)
        if (r.kept[a])
            row[a] = cursor[static_cast<size_t>(r.idx[a])]++;
    const int64_t n_rows = offset.back();
    const Tensor row_dev = upload_values(g, s, row, DType::i64);
    const Tensor weight_dev = upload_values(g, s, r.weight, DType::f32);
    // the experts' adapters: each expert's grouped rows per adapter (lora_rows.h)
    const std::vector<std::vector<AdapterRowsW>> lora_rows =
        lora ? upload_lora_rows(
                   g,
                   s,
                   expert_adapter_rows(row, k, lora->row_adapter, offset, lora->n_adapters),
                   n_exp)
             : std::vector<std::vector<AdapterRowsW>>();
    // f(expert's adapters, its rows per adapter) for each expert with adapted rows
    auto each_adapted = [&](auto&& f) {
        for (size_t e = 0; e < lora_rows.size(); ++e)
            if (!lora_rows[e].empty())
                f(w.expert_lora[e], lora_rows[e]);
    };

    // experts on the kept rows, then the weighted sum in slot order (fp32)
    Tensor in = s(cd, {n_rows, width});  // [n_rows, w] rows grouped by expert
    cu::moe_permute(g.stream, z, row_dev, k, in);
    const int64_t inter = w.up.dim(1);
    Tensor up = s(cd, {n_rows, inter}), gate;  // [n_rows, I]
    g.blas.grouped_linear(in, w.up, r.tokens_per_expert, up);
    each_adapted([&](const MlpLoraW& a, const auto& rows) { lora_apply(g, a.up, rows, in, up); });
    if (m.expert_act == ExpertAct::swiglu) {
        gate = s(cd, {n_rows, inter});
        g.blas.grouped_linear(in, w.gate, r.tokens_per_expert, gate);
        each_adapted(
            [&](const MlpLoraW& a, const auto& rows) { lora_apply(g, a.gate, rows, in, gate); });
    }
    Tensor out = s(cd, {n_rows, width});                   // [n_rows, w]
    const Tensor h = activate(g, m.expert_act, gate, up);  // [n_rows, I]
    g.blas.grouped_linear(h, w.down, r.tokens_per_expert, out);
    each_adapted([&](const MlpLoraW& a, const auto& rows) { lora_apply(g, a.down, rows, h, out); });
    cu::moe_unpermute(g.stream, out, row_dev, weight_dev, k, acc);
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
    g.blas.linear(x, w.router, logits);
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
    if (m.n_shared_experts > 0)
        mlp_block(g, w.shared, m.expert_act, xc, y, 1.0f, has_rows ? &lora->rows : nullptr);

    MoeCommStats one;  // the one-rank MoE: only its expert load
    one.calls = 1;
    one.tokens_per_expert = std::move(load);
    stats.add(one);
}

}  // namespace hymoe::model::gpu
