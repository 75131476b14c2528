// The MoE layer forward (spec/model-math.md §6-7) in Megatron's four phases on one process:
// route → dispatch (gather each expert's kept tokens, in token order, into one contiguous block
// per expert) → expert computation (each expert on its block) → combine (each token adds
// w_i · out_i over its top-k slots in slot order, in fp32, so the sum never depends on the order
// the experts ran in). LatentMoE projects x → z = fc1 x before dispatch and the combined
// y_lat → fc2 y_lat after; the shared experts always run on the full-width x and are added last.
// The router runs one token at a time (router.cpp), so a token's expert choice is a function of
// its own x bit for bit, whatever shares its batch; the expert, latent and shared products are
// batched GEMMs over each expert's gathered rows (BLAS may round a row differently with its
// position in a call, so outputs agree across batchings to ~1e-6, not bit for bit).
#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "hymoe/backend/ops.h"
#include "hymoe/core/error.h"
#include "hymoe/model/ffn.h"

namespace hymoe::model {

namespace {

// Where each kept assignment's row lives in the expert-grouped buffers: expert e owns rows
// [offset[e], offset[e+1]), its tokens ascending.
struct Dispatch {
    std::vector<int64_t> offset;  // [E + 1]
    std::vector<int64_t> row;     // [n_tok, top_k] grouped row of slot (t, i); −1 if dropped
};

Dispatch plan_dispatch(const Routing& r, int64_t n_tok, int64_t top_k) {
    Dispatch p;
    const size_t n_exp = r.tokens_per_expert.size();
    p.offset.assign(n_exp + 1, 0);
    for (size_t e = 0; e < n_exp; ++e)
        p.offset[e + 1] = p.offset[e] + r.tokens_per_expert[e];
    std::vector<int64_t> cursor(p.offset.begin(), p.offset.end() - 1);  // [E]
    p.row.assign(static_cast<size_t>(n_tok * top_k), -1);
    for (size_t a = 0; a < p.row.size(); ++a)  // token-major, so each expert's rows ascend
        if (r.kept[a])
            p.row[a] = cursor[static_cast<size_t>(r.idx[a])]++;
    return p;
}

// The routed part: acc [n_tok, w] = Σ_i w_i · Expert_idx_i(z) for z [n_tok, w]; each token's
// adapter from token_adapter ([n_tok], empty: adapter 0).
void routed_experts(const MoeConfig& m,
                    const MoeWeights& w,
                    const Routing& r,
                    const Tensor& z /*[n_tok, w]*/,
                    Tensor& acc /*[n_tok, w]*/,
                    const std::vector<int>& token_adapter) {
    const int64_t n_tok = z.dim(0), width = z.dim(1), k = m.top_k;
    const Dispatch p = plan_dispatch(r, n_tok, k);
    const int64_t n_rows = p.offset.back();
    Buffer in(DType::f32, {n_rows, width});   // [n_rows, w] tokens grouped by expert
    Buffer out(DType::f32, {n_rows, width});  // [n_rows, w] expert outputs, same rows
    const auto row_bytes = static_cast<size_t>(width) * sizeof(float);
    for (size_t a = 0; a < p.row.size(); ++a)
        if (p.row[a] >= 0)
            std::memcpy(in.ptr<float>() + p.row[a] * width,
                        z.ptr<float>() + static_cast<int64_t>(a) / k * width,
                        row_bytes);
    std::vector<int> row_adapter(token_adapter.empty() ? 0 : static_cast<size_t>(n_rows));
    for (size_t a = 0; a < p.row.size() && !token_adapter.empty(); ++a)
        if (p.row[a] >= 0)
            row_adapter[p.row[a]] = token_adapter[static_cast<size_t>(a) / k];
    for (size_t e = 0; e + 1 < p.offset.size(); ++e) {
        const int64_t begin = p.offset[e], count = p.offset[e + 1] - begin;
        if (count == 0)
            continue;
        Tensor out_rows = out.view().rows(begin, count);
        SeqBatch rows;  // the adapter of each of the expert's rows
        if (!token_adapter.empty())
            rows = single_rows(
                std::vector<int>(row_adapter.begin() + begin, row_adapter.begin() + begin + count));
        dense_ffn_forward(w.experts[e],
                          m.expert_act,
                          in.view().rows(begin, count),
                          out_rows,
                          token_adapter.empty() ? nullptr : &rows);
    }
    for (int64_t t = 0; t < n_tok; ++t) {
        float* y = acc.ptr<float>() + t * width;
        std::fill(y, y + width, 0.0f);
        for (int64_t i = 0; i < k; ++i) {
            const int64_t row = p.row[static_cast<size_t>(t * k + i)];
            if (row < 0)
                continue;
            const float wt = r.weight[static_cast<size_t>(t * k + i)];
            const float* o = out.ptr<float>() + row * width;
            for (int64_t j = 0; j < width; ++j)
                y[j] += wt * o[j];
        }
    }
}

}  // namespace

void moe_forward(const ModelConfig& cfg,
                 const LayerSpec& spec,
                 const MoeWeights& w,
                 const Tensor& x /*[n_tok, d]*/,
                 Tensor& y /*[n_tok, d]*/,
                 Routing* routing_out,
                 const SeqBatch* rows) {
    const MoeConfig& m = cfg.moe;
    const int64_t n_tok = x.dim(0), d = cfg.hidden_size;
    HYMOE_CHECK(spec.ffn == Ffn::moe || spec.ffn == Ffn::latent_moe, "not an MoE layer");
    HYMOE_CHECK(y.shape == x.shape && y.data != x.data,
                "x ",
                shape_string(x.shape),
                " y ",
                shape_string(y.shape));
    HYMOE_CHECK(static_cast<int64_t>(w.experts.size()) == m.n_routed_experts,
                w.experts.size(),
                " experts loaded, config has ",
                m.n_routed_experts);
    Routing r = route(cfg, w, x);
    const std::vector<int> token_adapter = rows ? row_adapters(*rows) : std::vector<int>();
    if (spec.ffn == Ffn::latent_moe) {
        const int64_t ell = m.latent_size;
        Buffer z(DType::f32, {n_tok, ell});      // [n_tok, ℓ] fc1 x
        Buffer y_lat(DType::f32, {n_tok, ell});  // [n_tok, ℓ] combined expert outputs
        ops::linear(x, w.fc1_latent_proj.view(), z.view());
        routed_experts(m, w, r, z.view(), y_lat.view(), token_adapter);
        ops::linear(y_lat.view(), w.fc2_latent_proj.view(), y);
    } else {
        routed_experts(m, w, r, x, y, token_adapter);
    }
    if (m.n_shared_experts > 0) {
        Buffer shared(DType::f32, {n_tok, d});  // [n_tok, d]
        dense_ffn_forward(w.shared, m.expert_act, x, shared.view(), rows);
        ops::add_inplace(y, shared.view());
    }
    if (routing_out)
        *routing_out = std::move(r);
}

}  // namespace hymoe::model
