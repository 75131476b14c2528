// The fixtures of the expert-parallel MoE tests (test_moe_parallel.cpp, forward;
// test_moe_parallel_backward.cpp, backward): a small MoE config, whole random weights, each rank's
// slice of them by the loader's contract (sliced here, independently of model/shard), every
// layout of a world size, each dp replica's own tokens, the etp blocks' owned rows, the analytic
// minimum dispatch payload, and error measures agreed over the world.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <mpi.h>

#include "hymoe/core/rng.h"
#include "hymoe/model/ffn.h"
#include "hymoe/model/weights.h"
#include "hymoe/parallel/grid.h"

namespace hymoe::testing::moe {

using namespace hymoe::model;
using hymoe::parallel::Layout;

inline constexpr int kExperts = 8;

// d 32, E 8, top_k 2 or 3, sigmoid + bias, renormalised, ρ 2.5, one shared expert of width 16;
// routed width 16 (so etp up to 8 still gets 2 columns), ℓ 16.
inline ModelConfig test_config(int top_k, ExpertAct act, double capacity_factor = 0.0) {
    ModelConfig c;
    c.model_type = "hymoe";
    c.hidden_size = 32;
    MoeConfig& m = c.moe;
    m.n_routed_experts = kExperts;
    m.top_k = top_k;
    m.n_shared_experts = 1;
    m.moe_intermediate = 16;
    m.shared_intermediate = 16;
    m.latent_size = 16;
    m.scoring = Scoring::sigmoid;
    m.correction_bias = true;
    m.routed_scaling_factor = 2.5;
    m.expert_act = act;
    m.capacity_factor = capacity_factor;
    return c;
}

// Whole weights at unit-variance scale (std = fan_in^{-1/2}); the same seed on every rank.
inline MoeWeights whole_weights(const ModelConfig& cfg, const LayerSpec& spec) {
    MoeWeights w;
    TensorList list = ffn_tensors(cfg, spec, nullptr, &w);
    for (TensorSpec& s : list)
        if (s.init == Init::normal)
            s.std = 1.0f / std::sqrt(static_cast<float>(s.shape[1]));
    Philox rng(1234, 0, 0);
    init_random(list, rng);
    return w;
}

// Rows or columns [part·n/parts, (part+1)·n/parts) of a 2-D buffer (an empty one stays empty).
inline Buffer slice(const Buffer& whole, int dim, int part, int parts) {
    const Tensor& t = whole.view();
    if (t.data == nullptr || t.numel() == 0)
        return Buffer();
    const int64_t rows = t.dim(0), cols = t.dim(1);
    const int64_t n = (dim == 0 ? rows : cols) / parts, at = part * n;
    Buffer out(DType::f32, dim == 0 ? Shape{n, cols} : Shape{rows, n});
    for (int64_t r = 0; r < out.view().dim(0); ++r)
        for (int64_t c = 0; c < out.view().dim(1); ++c)
            out.ptr<float>()[r * out.view().dim(1) + c] =
                dim == 0 ? t.ptr<float>()[(at + r) * cols + c] : t.ptr<float>()[r * cols + at + c];
    return out;
}

inline Buffer copy_of(const Buffer& whole) {
    const Tensor& t = whole.view();
    if (t.data == nullptr)
        return Buffer();
    Buffer out(t.dtype, t.shape);
    std::memcpy(out.view().data, t.data, t.bytes());
    return out;
}

// One MLP's part `part` of `parts`: gate/up rows, down columns.
inline DenseFfnWeights mlp_part(const DenseFfnWeights& w, int part, int parts) {
    return {slice(w.gate_proj, 0, part, parts),
            slice(w.up_proj, 0, part, parts),
            slice(w.down_proj, 1, part, parts),
            {}};
}

// What the loader gives this rank (the contract in moe_parallel.h), sliced here independently.
inline MoeWeights local_weights(const MoeWeights& whole,
                                const Layout& l,
                                const parallel::Coords& me) {
    MoeWeights w;
    w.gate = copy_of(whole.gate);
    w.correction_bias = copy_of(whole.correction_bias);
    w.fc1_latent_proj = copy_of(whole.fc1_latent_proj);
    w.fc2_latent_proj = copy_of(whole.fc2_latent_proj);
    w.experts.resize(whole.experts.size());
    const int per_rank = kExperts / l.ep;
    for (int e = me.ep * per_rank; e < (me.ep + 1) * per_rank; ++e)
        w.experts[static_cast<size_t>(e)] =
            mlp_part(whole.experts[static_cast<size_t>(e)], me.etp, l.etp);
    w.shared = mlp_part(whole.shared, me.tp, l.tp);
    return w;
}

// Every (tp, dp, pp 1, ep, etp) of this world with etp | tp and ep | E.
inline std::vector<Layout> moe_layouts(int world) {
    std::vector<Layout> out;
    for (int tp = 1; tp <= world; ++tp)
        for (int ep = 1; ep <= world; ++ep)
            for (int etp = 1; etp <= tp; ++etp)
                if (world % tp == 0 && tp % etp == 0 && world % (ep * etp) == 0 &&
                    kExperts % ep == 0)
                    out.push_back(Layout{tp, world / tp, 1, ep, etp});
    return out;
}

inline std::string describe(const Layout& l) {
    std::ostringstream s;
    s << "tp" << l.tp << " dp" << l.dp << " ep" << l.ep << " etp" << l.etp;
    return s.str();
}

// Each dp replica's own tokens: 13, 0, 9, 6, ... rows (replica 1 has none).
inline Buffer replica_tokens(int dp_rank, int64_t d) {
    const int64_t counts[] = {13, 0, 9, 6, 11, 4, 1, 8};
    const int64_t n_tok = counts[dp_rank % 8];
    Buffer x(DType::f32, {n_tok, d});  // [n_tok, d]
    Philox rng(99, 1, static_cast<uint32_t>(dp_rank));
    rng.fill_normal(x.ptr<float>(), static_cast<size_t>(x.view().numel()), 0.0f, 1.0f);
    return x;
}

// The rows [begin, end) an etp block owns, written out here (not moe_owned_rows).
inline std::pair<int64_t, int64_t> owned(int64_t n_tok, const Layout& l, int tp_rank) {
    const int64_t blocks = l.tp / l.etp, b = tp_rank / l.etp;
    const int64_t base = n_tok / blocks, extra = n_tok % blocks;
    const int64_t begin = b * base + std::min(b, extra);
    return {begin, begin + base + (b < extra ? 1 : 0)};
}

// max |a − b| / max |b| over n floats (0 for n = 0).
inline double relative_error(const float* a, const float* b, int64_t n) {
    double diff = 0, scale = 1e-30;
    for (int64_t i = 0; i < n; ++i) {
        diff = std::max(diff, static_cast<double>(std::abs(a[i] - b[i])));
        scale = std::max(scale, static_cast<double>(std::abs(b[i])));
    }
    return n == 0 ? 0.0 : diff / scale;
}

inline double world_max(double v) {
    MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return v;
}

// The analytic minimum payload of owned rows [begin, end): each token times the number of
// distinct ep ranks hosting its kept experts, × width × 4 bytes.
inline int64_t minimum_bytes(
    const Routing& r, int top_k, int ep, int64_t begin, int64_t end, int64_t w) {
    int64_t rows = 0;
    for (int64_t t = begin; t < end; ++t) {
        std::set<int64_t> ranks;
        for (int i = 0; i < top_k; ++i)
            if (r.kept[static_cast<size_t>(t * top_k + i)])
                ranks.insert(r.idx[static_cast<size_t>(t * top_k + i)] / (kExperts / ep));
        rows += static_cast<int64_t>(ranks.size());
    }
    return rows * w * static_cast<int64_t>(sizeof(float));
}

}  // namespace hymoe::testing::moe
