// The FFN blocks on the GPU (device_blocks.h): the SwiGLU/relu2 MLP (dense layers and shared
// experts) and the MoE layer in model/moe.cpp's phases. Routing: the router logits [n_tok, E] are
// one fp32 GEMM on the device, copied to the host, and routed there by the CPU's own code
// (router.h: scores, groups, top-k, weights, capacity), so the expert choice is the CPU's given
// the logits. The host plans the dispatch exactly as moe.cpp (each expert's kept tokens
// contiguous, in token order) and uploads the row map and weights; then permute, the experts as
// grouped GEMMs (one launch per matrix for all experts), the activation and the slot-ordered
// combine into fp32 run on the device.
#include <vector>

#include "../router.h"
#include "device_blocks.h"
#include "hymoe/backend/cuda_ops.h"
#include "hymoe/core/error.h"

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

void mlp_block(Gpu& g, const MlpW& w, ExpertAct act, const Tensor& x, Tensor& y, float beta) {
    const int64_t n = x.dim(0), inter = w.up.dim(0);
    Scratch s(g.arena);
    Tensor up = s(x.dtype, {n, inter});  // [n, I]
    Tensor gate;                         // [n, I] (swiglu)
    g.blas.linear(x, w.up, up);
    if (act == ExpertAct::swiglu) {
        gate = s(x.dtype, {n, inter});
        g.blas.linear(x, w.gate, gate);
    }
    g.blas.linear(activate(g, act, gate, up), w.down, y, beta);
}

void moe_block(Gpu& g,
               const ModelConfig& cfg,
               const LayerSpec& spec,
               const MoeW& w,
               const Tensor& x,
               DType cd,
               Tensor& y,
               MoeCommStats& stats) {
    const MoeConfig& m = cfg.moe;
    const int64_t n = x.dim(0), k = m.top_k, n_exp = m.n_routed_experts;
    const bool latent = spec.ffn == Ffn::latent_moe;
    const int64_t width = latent ? m.latent_size : cfg.hidden_size;
    Scratch s(g.arena);

    // route: logits on the device, the rest on the host (router.h)
    Tensor logits = s(DType::f32, {n, n_exp});
    g.blas.linear(x, w.router, logits);
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

    // experts on the kept rows, then the weighted sum in slot order (fp32)
    const Tensor xc = in_dtype(g, s, x, cd);
    Tensor z = xc;  // [n, w] the experts' input
    if (latent) {
        z = s(cd, {n, width});
        g.blas.linear(xc, w.fc1, z);
    }
    Tensor in = s(cd, {n_rows, width});  // [n_rows, w] rows grouped by expert
    cu::moe_permute(g.stream, z, row_dev, k, in);
    const int64_t inter = w.up.dim(1);
    Tensor up = s(cd, {n_rows, inter}), gate;  // [n_rows, I]
    g.blas.grouped_linear(in, w.up, r.tokens_per_expert, up);
    if (m.expert_act == ExpertAct::swiglu) {
        gate = s(cd, {n_rows, inter});
        g.blas.grouped_linear(in, w.gate, r.tokens_per_expert, gate);
    }
    Tensor out = s(cd, {n_rows, width});  // [n_rows, w]
    g.blas.grouped_linear(activate(g, m.expert_act, gate, up), w.down, r.tokens_per_expert, out);
    if (latent) {
        Tensor y_lat = s(DType::f32, {n, width});  // [n, ℓ]
        cu::moe_combine(g.stream, out, row_dev, weight_dev, k, y_lat);
        g.blas.linear(in_dtype(g, s, y_lat, cd), w.fc2, y);
    } else {
        cu::moe_combine(g.stream, out, row_dev, weight_dev, k, y);
    }
    if (m.n_shared_experts > 0)
        mlp_block(g, w.shared, m.expert_act, xc, y, 1.0f);  // y += Shared(x)

    MoeCommStats load;  // the one-rank MoE: only its expert load
    load.calls = 1;
    load.tokens_per_expert = std::move(r.tokens_per_expert);
    stats.add(load);
}

}  // namespace hymoe::model::gpu
