// Uploading a layer's weights to the GPU model (device_blocks.h), at the shapes the weight list
// (model/tensor_list.h) gave the host buffers: matrices in the compute dtype
// (widened from the host's storage dtype, then rounded to bf16, to nearest even, when cd is bf16),
// vectors, conv taps and the router in fp32. The routed experts' matrices are stacked on the way
// into [E, out, in] blocks (one grouped GEMM reads them).
#include <cstring>
#include <vector>

#include "device_blocks.h"
#include "hymoe/core/error.h"
#include "hymoe/model/model.h"

namespace hymoe::model::gpu {

namespace {

// The host values of several buffers (widened to fp32), one after the other.
std::vector<float> stacked(const std::vector<const Buffer*>& parts) {
    std::vector<float> all;
    for (const Buffer* b : parts) {
        const std::vector<float> x = widened(b->view());
        all.insert(all.end(), x.begin(), x.end());
    }
    return all;
}

// n host floats as a device tensor of `shape` and `dtype`.
Tensor upload_floats(Gpu& g, const float* host, int64_t n, Shape shape, DType dtype) {
    HYMOE_CHECK(shape_numel(shape) == n, "upload: ", n, " values for ", shape_string(shape));
    Tensor dev = g.arena.tensor(dtype, std::move(shape));
    std::vector<uint16_t> staged;  // bf16: the rounded values
    if (dtype == DType::bf16) {
        staged.resize(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i)
            staged[static_cast<size_t>(i)] = float_to_bf16(host[i]);
    }
    cu::copy_to_device(dev.data,
                       staged.empty() ? static_cast<const void*>(host) : staged.data(),
                       dev.bytes(),
                       g.stream);
    g.stream.synchronize();  // the host values may go when this returns
    return dev;
}

Tensor upload_floats(Gpu& g, const std::vector<float>& host, Shape shape, DType dtype) {
    return upload_floats(
        g, host.data(), static_cast<int64_t>(host.size()), std::move(shape), dtype);
}

KdaW upload_kda(Gpu& g, const KdaWeights& w, DType cd) {
    KdaW out;
    out.q_proj = upload_weight(g, w.q_proj, cd);
    out.k_proj = upload_weight(g, w.k_proj, cd);
    out.v_proj = upload_weight(g, w.v_proj, cd);
    out.q_conv1d = upload_weight(g, w.q_conv1d, DType::f32);
    out.k_conv1d = upload_weight(g, w.k_conv1d, DType::f32);
    out.v_conv1d = upload_weight(g, w.v_conv1d, DType::f32);
    out.f_a_proj = upload_weight(g, w.f_a_proj, cd);
    out.f_b_proj = upload_weight(g, w.f_b_proj, cd);
    out.dt_bias = upload_weight(g, w.dt_bias, DType::f32);
    out.a_log = upload_weight(g, w.a_log, DType::f32);
    out.b_proj = upload_weight(g, w.b_proj, cd);
    out.g_a_proj = upload_weight(g, w.g_a_proj, cd);
    out.g_b_proj = upload_weight(g, w.g_b_proj, cd);
    out.o_norm = upload_weight(g, w.o_norm, DType::f32);
    out.o_proj = upload_weight(g, w.o_proj, cd);
    return out;
}

MlaW upload_mla(
    Gpu& g, const ModelConfig& cfg, const LayerSpec& spec, const MlaWeights& w, DType cd) {
    MlaW out;
    if (cfg.mla.q_lora_rank > 0) {
        out.q_a = upload_weight(g, w.q_a_proj, cd);
        out.q_a_norm = upload_weight(g, w.q_a_layernorm, DType::f32);
        out.q_b = upload_weight(g, w.q_b_proj, cd);
    } else {
        out.q = upload_weight(g, w.q_proj, cd);
    }
    out.kv_a = upload_weight(g, w.kv_a_proj_with_mqa, cd);
    out.kv_a_norm = upload_weight(g, w.kv_a_layernorm, DType::f32);
    out.kv_b = upload_weight(g, w.kv_b_proj, cd);
    out.o_proj = upload_weight(g, w.o_proj, cd);
    if (spec.gated)
        out.g_proj = upload_weight(g, w.g_proj, cd);
    if (spec.mixer == Mixer::dsa) {
        const IndexerWeights& iw = w.indexer;
        out.indexer.wq_b = upload_weight(g, iw.wq_b, cd);
        out.indexer.wk = upload_weight(g, iw.wk, cd);
        out.indexer.k_norm_w = upload_weight(g, iw.k_norm_weight, DType::f32);
        out.indexer.k_norm_b = upload_weight(g, iw.k_norm_bias, DType::f32);
        out.indexer.weights_proj = upload_weight(g, iw.weights_proj, cd);
    }
    return out;
}

MlpW upload_mlp(Gpu& g, const DenseFfnWeights& w, ExpertAct act, DType cd) {
    MlpW out;
    if (act == ExpertAct::swiglu)
        out.gate_proj = upload_weight(g, w.gate_proj, cd);
    out.up_proj = upload_weight(g, w.up_proj, cd);
    out.down_proj = upload_weight(g, w.down_proj, cd);
    return out;
}

// The held experts' matrix `which` as one [E_held, rows, cols] tensor, ids ascending: all E of a
// whole model, the hosted ones of an ep shard (model/shard.h: the others are left empty).
Tensor upload_experts(Gpu& g,
                      const std::vector<DenseFfnWeights>& experts,
                      Buffer DenseFfnWeights::*which,
                      DType cd) {
    std::vector<const Buffer*> parts;
    for (const DenseFfnWeights& e : experts)
        if (e.up_proj.view().data != nullptr)
            parts.push_back(&(e.*which));
    HYMOE_CHECK(!parts.empty(), "GPU model: an MoE layer holds no routed expert");
    const Shape& one = parts.front()->view().shape;
    for (const Buffer* b : parts)
        HYMOE_CHECK(b->view().shape == one,
                    "GPU model: experts of unequal shapes (",
                    shape_string(b->view().shape),
                    " and ",
                    shape_string(one),
                    "): is every expert loaded?");
    return upload_floats(
        g, stacked(parts), {static_cast<int64_t>(parts.size()), one.at(0), one.at(1)}, cd);
}

MoeW upload_moe(
    Gpu& g, const ModelConfig& cfg, const LayerSpec& spec, const MoeWeights& w, DType cd) {
    const MoeConfig& m = cfg.moe;
    MoeW out;
    out.router = upload_weight(g, w.gate, DType::f32);
    if (spec.ffn == Ffn::latent_moe) {
        out.fc1 = upload_weight(g, w.fc1_latent_proj, cd);
        out.fc2 = upload_weight(g, w.fc2_latent_proj, cd);
    }
    if (m.expert_act == ExpertAct::swiglu)
        out.gate = upload_experts(g, w.experts, &DenseFfnWeights::gate_proj, cd);
    out.up = upload_experts(g, w.experts, &DenseFfnWeights::up_proj, cd);
    out.down = upload_experts(g, w.experts, &DenseFfnWeights::down_proj, cd);
    // [held, rows, cols] → its slices, for ops::grouped_linear
    auto slices = [](const Tensor& stacked) {
        std::vector<Tensor> v;
        for (int64_t e = 0; stacked.data != nullptr && e < stacked.dim(0); ++e)
            v.push_back(Tensor{at(stacked, e * stacked.dim(1) * stacked.dim(2)),
                               stacked.dtype,
                               stacked.device,
                               {stacked.dim(1), stacked.dim(2)}});
        return v;
    };
    out.experts.gate = slices(out.gate);
    out.experts.up = slices(out.up);
    out.experts.down = slices(out.down);
    if (m.n_shared_experts > 0)
        out.shared = upload_mlp(g, w.shared, m.expert_act, cd);
    out.host.expert_rank = w.expert_rank;
    if (m.correction_bias) {
        out.bias = upload_weight(g, w.correction_bias, DType::f32);
        out.host.correction_bias = Buffer(DType::f32, w.correction_bias.view().shape);
        std::memcpy(out.host.correction_bias.ptr<float>(),
                    w.correction_bias.ptr<float>(),
                    w.correction_bias.view().bytes());
    }
    return out;
}

}  // namespace

Tensor in_dtype(Gpu& g, Scratch& s, const Tensor& x, DType cd) {
    if (x.dtype == cd)
        return x;
    Tensor c = s(cd, x.shape);
    cu::cast(g.stream, x, c);
    return c;
}

Tensor upload_weight(Gpu& g, const Buffer& host, DType dtype) {
    HYMOE_CHECK(host.view().data != nullptr, "GPU model: a weight is not loaded");
    return upload_weight(g, host, host.view().shape, dtype);
}

Tensor upload_weight(Gpu& g, const Buffer& host, Shape shape, DType dtype) {
    const Tensor& v = host.view();
    HYMOE_CHECK(v.numel() == shape_numel(shape),
                "GPU model: a weight of ",
                shape_string(v.shape),
                " where ",
                shape_string(shape),
                " was expected (are the weights loaded?)");
    const std::vector<float> x = widened(v);  // host matrices may be held in bf16
    return upload_floats(g, x.data(), v.numel(), std::move(shape), dtype);
}

LayerW upload_layer(Gpu& g, const ModelConfig& cfg, const LayerWeights& host, int layer, DType cd) {
    const LayerSpec& spec = cfg.layers[static_cast<size_t>(layer)];
    LayerW out;
    out.attn_norm = upload_weight(g, host.attn_norm, DType::f32);
    out.ffn_norm = upload_weight(g, host.ffn_norm, DType::f32);
    if (spec.mixer == Mixer::kda)
        out.kda = upload_kda(g, host.kda, cd);
    else
        out.mla = upload_mla(g, cfg, spec, host.attn, cd);
    if (spec.ffn == Ffn::dense)
        out.dense = upload_mlp(g, host.dense, ExpertAct::swiglu, cd);
    else
        out.moe = upload_moe(g, cfg, spec, host.moe, cd);
    return out;
}

}  // namespace hymoe::model::gpu
