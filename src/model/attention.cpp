// MLA / DSA / gated attention forward (spec/model-math.md §4-5; DeepSeek-V3.2 inference/model.py
// `MLA.forward`, both branches). One call: project the new tokens of every sequence at once
// (queries, latent, rope key, indexer inputs), append the latent, rope key and indexer key to
// each sequence's cache (ops::latent_append), then every row's attention over its sequence's
// whole cache (ops::mla_attend, backend/ops_mla.h: the forms and their blocks), then gate and
// project out.
#include "hymoe/model/attention.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "hymoe/backend/ops.h"
#include "hymoe/backend/ops_attention.h"
#include "hymoe/backend/ops_kda.h"
#include "hymoe/backend/ops_mla.h"
#include "hymoe/backend/ops_rows.h"
#include "hymoe/core/error.h"
#include "hymoe/core/timer.h"
#include "hymoe/model/attention_backward_views.h"
#include "hymoe/model/attention_views.h"
#include "hymoe/model/kv_cache.h"
#include "hymoe/model/model.h"
#include "mla_project.h"

namespace hymoe::model {

using detail::mla_dims;
using detail::MlaDims;

namespace {

static_assert(kPrefillAlign % ops::kMlaQueryBlock == 0, "model.h: kPrefillAlign");

// HF DeepSeek yarn_get_mscale.
double yarn_get_mscale(double factor, double mscale) {
    return factor <= 1.0 ? 1.0 : 0.1 * mscale * std::log(factor) + 1.0;
}

// Sequence s's cache as a view (block-table row 0) with room for its n_new rows: a paged
// cache's pages (they must cover them), or its own arrays grown (ptrs: the page pointers).
backend::LatentCache cache_view(
    AttnCache& c, const MlaDims& m, int64_t d_i, int64_t n_new, std::vector<void*>& ptrs) {
    if (c.pool == nullptr) {
        c.c_kv.resize(static_cast<size_t>((c.n + n_new) * m.r_kv));
        c.k_r.resize(static_cast<size_t>((c.n + n_new) * m.d_r));
        c.k_idx.resize(static_cast<size_t>((c.n + n_new) * d_i));
        backend::LatentCache v;
        v.r_kv = m.r_kv;
        v.d_r = m.d_r;
        v.d_i = d_i;
        v.planes[0] = c.c_kv.data();
        v.planes[1] = c.k_r.data();
        v.planes[2] = c.k_idx.data();
        return v;
    }
    const int64_t pt = c.pool->page_tokens();
    HYMOE_CHECK(static_cast<int64_t>(c.pages->size()) * pt >= c.n + n_new,
                "attention: the block table covers ",
                c.pages->size() * pt,
                " tokens, not ",
                c.n + n_new);
    return c.pool->latent_view(c.layer, *c.pages, c.n, c.n + n_new, m.r_kv, m.d_r, ptrs);
}

// The indexer's scores summed over the tp group's ranks (ops::ScoreReduce).
void reduce_over_tp(Tensor& scores, const void* tp) {
    comm::all_reduce(scores, *static_cast<const comm::Comm*>(tp));
}

ops::MlaForm form_of(AttnMode mode) {
    switch (mode) {
        case AttnMode::expanded:
            return ops::MlaForm::expanded;
        case AttnMode::absorbed:
            return ops::MlaForm::absorbed;
        case AttnMode::sparse:
            return ops::MlaForm::sparse;
        case AttnMode::automatic:
            break;
    }
    return ops::MlaForm::automatic;
}

void check_call(const ModelConfig& cfg,
                const LayerSpec& spec,
                const Tensor& x,
                const SeqBatch& batch,
                const std::vector<AttnCache*>& caches,
                const Tensor& y,
                bool device_rows) {
    const MlaDims m = mla_dims(cfg);
    HYMOE_CHECK(spec.mixer == Mixer::mla || spec.mixer == Mixer::dsa,
                "attention_forward on a ",
                to_string(spec.mixer),
                " layer");
    HYMOE_CHECK(
        x.shape.size() == 2 && x.dim(0) == batch.n_tok() && x.dim(1) == m.d && y.shape == x.shape,
        "attention_forward: x ",
        shape_string(x.shape),
        " y ",
        shape_string(y.shape),
        " for ",
        batch.n_tok(),
        " tokens of width ",
        m.d);
    HYMOE_CHECK(!device_rows || caches.empty(),
                "attention_forward: the device rows and host caches together");
    HYMOE_CHECK(caches.empty() || static_cast<int64_t>(caches.size()) == batch.n_seq(),
                "attention_forward: ",
                caches.size(),
                " caches for ",
                batch.n_seq(),
                " sequences");
    for (int64_t s = 0; s < batch.n_seq(); ++s) {
        HYMOE_CHECK(caches.empty() || caches[s] != nullptr, "attention_forward: no cache for ", s);
        const int64_t held = caches.empty() ? 0 : caches[s]->n;
        HYMOE_CHECK(device_rows || batch.pos0[s] == held,
                    "attention_forward: sequence ",
                    s,
                    " starts at ",
                    batch.pos0[s],
                    " but its cache holds ",
                    held,
                    " tokens");
    }
    if (spec.mixer == Mixer::dsa)
        HYMOE_CHECK(m.r_q > 0 && cfg.indexer.top_k > 0,
                    "attention_forward: DSA needs a query ",
                    "latent (q_lora_rank ",
                    m.r_q,
                    ") and top-k > 0 (",
                    cfg.indexer.top_k,
                    ")");
}

}  // namespace

TensorList attention_tensors(const ModelConfig& cfg, const LayerSpec& spec, MlaWeights* w) {
    const MlaDims m = mla_dims(cfg);
    const int64_t q_rows = m.n_head * m.d_qk();  // n_head: this rank's heads under tp
    using W = MlaWeights;
    using X = IndexerWeights;
    TensorList list;  // the MLA block's, then the indexer's
    if (m.r_q > 0) {
        list.push_back({"q_a_proj.weight", {m.r_q, m.d}, slot(w, &W::q_a_proj)});
        list.push_back({"q_a_layernorm.weight", {m.r_q}, slot(w, &W::q_a_layernorm), Init::ones});
        list.push_back(split(0, {"q_b_proj.weight", {q_rows, m.r_q}, slot(w, &W::q_b_proj)}));
    } else {
        list.push_back(split(0, {"q_proj.weight", {q_rows, m.d}, slot(w, &W::q_proj)}));
    }
    list.push_back(
        {"kv_a_proj_with_mqa.weight", {m.d_lat(), m.d}, slot(w, &W::kv_a_proj_with_mqa)});
    list.push_back({"kv_a_layernorm.weight", {m.r_kv}, slot(w, &W::kv_a_layernorm), Init::ones});
    list.push_back(
        split(0, {"kv_b_proj.weight", {m.n_head * m.d_kvb(), m.r_kv}, slot(w, &W::kv_b_proj)}));
    list.push_back(split(1, {"o_proj.weight", {m.d, m.n_head * m.d_v}, slot(w, &W::o_proj)}));
    if (spec.gated)
        list.push_back(split(0, {"g_proj.weight", {m.n_head * m.d_v, m.d}, slot(w, &W::g_proj)}));
    list = in_block(WeightBlock::mla, std::move(list));
    if (spec.mixer == Mixer::dsa) {
        const int64_t h_i = cfg.indexer.n_head, d_i = cfg.indexer.head_dim;  // h_i: under tp
        IndexerWeights* x = w ? &w->indexer : nullptr;
        const TensorList indexer = in_block(
            WeightBlock::indexer,
            {split(0, {"indexer.wq_b.weight", {h_i * d_i, m.r_q}, slot(x, &X::wq_b)}),
             {"indexer.wk.weight", {d_i, m.d}, slot(x, &X::wk)},
             {"indexer.k_norm.weight", {d_i}, slot(x, &X::k_norm_weight), Init::ones},
             {"indexer.k_norm.bias", {d_i}, slot(x, &X::k_norm_bias), Init::zeros},
             split(0, {"indexer.weights_proj.weight", {h_i, m.d}, slot(x, &X::weights_proj)})});
        list.insert(list.end(), indexer.begin(), indexer.end());
    }
    return list;
}

ops::RopeFreqs mla_rope_freqs(const MlaConfig& mla) {
    if (mla.rope_scaling != RopeScaling::yarn)
        return ops::rope_freqs(mla.qk_rope_head_dim, mla.rope_theta);
    const double mscale = yarn_get_mscale(mla.yarn_factor, mla.yarn_mscale) /
                          yarn_get_mscale(mla.yarn_factor, mla.yarn_mscale_all_dim);
    return ops::rope_freqs_yarn(mla.qk_rope_head_dim,
                                mla.rope_theta,
                                mla.yarn_factor,
                                mla.yarn_original_max_position,
                                mla.yarn_beta_fast,
                                mla.yarn_beta_slow,
                                mscale);
}

MlaWeightViews attention_views(const MlaWeights& w) {
    const IndexerWeights& x = w.indexer;
    return {w.q_a_proj.view(),
            w.q_a_layernorm.view(),
            w.q_b_proj.view(),
            w.q_proj.view(),
            w.kv_a_proj_with_mqa.view(),
            w.kv_a_layernorm.view(),
            w.kv_b_proj.view(),
            w.o_proj.view(),
            w.g_proj.view(),
            {x.wq_b.view(),
             x.wk.view(),
             x.k_norm_weight.view(),
             x.k_norm_bias.view(),
             x.weights_proj.view()},
            &w.lora,
            {},
            nullptr};
}

void attention_forward(const backend::Ctx& ctx,
                       const ModelConfig& cfg,
                       const LayerSpec& spec,
                       const MlaWeights& w,
                       const Tensor& x,
                       const SeqBatch& batch,
                       const std::vector<AttnCache*>& caches,
                       Tensor& y,
                       AttnMode mode,
                       AttnStats* stats,
                       const comm::Comm* tp) {
    attention_forward(
        ctx, cfg, spec, attention_views(w), x, batch, caches, y, mode, stats, tp, nullptr);
}

void attention_forward(const backend::Ctx& ctx,
                       const ModelConfig& cfg,
                       const LayerSpec& spec,
                       const MlaWeightViews& w,
                       const Tensor& x,
                       const SeqBatch& batch,
                       const std::vector<AttnCache*>& caches,
                       Tensor& y,
                       AttnMode mode,
                       AttnStats* stats,
                       const comm::Comm* tp,
                       const DeviceAttnRows* dev) {
    const double start = wall_seconds();
    double indexer_seconds = 0;
    check_call(cfg, spec, x, batch, caches, y, dev != nullptr);
    if (ctx.device != Device::cpu && dev == nullptr && caches.empty()) {  // fresh: training
        attention_forward(ctx, cfg, spec, w, x, AttnBatchViews{&batch, {}}, y, tp);
        if (stats != nullptr)
            stats->attention_seconds += wall_seconds() - start;
        return;
    }
    HYMOE_CHECK(ctx.device == Device::cpu || dev != nullptr,
                "attention_forward: a ",
                to_string(ctx.device),
                " context with caches but without the call's rows on the device (DeviceAttnRows)");
    HYMOE_CHECK(w.lora_views.k.empty() && w.lora_views.v.empty(),
                "attention_forward: LoRA factors on k or v, projections an MLA/DSA block lacks");
    const LoraSlots none;
    const LoraSlots& lora = w.lora ? *w.lora : none;
    const MlaDims m = mla_dims(cfg);
    const int64_t n_tok = x.dim(0), n_seq = batch.n_seq();
    backend::Scratch scratch(ctx);
    std::vector<int64_t> pos_host(static_cast<size_t>(n_tok));
    for (int64_t s = 0; s < n_seq; ++s)
        for (int64_t t = batch.offsets[s]; t < batch.offsets[s + 1]; ++t)
            pos_host[t] = batch.pos0[s] + (t - batch.offsets[s]);
    Tensor pos = dev ? dev->pos : scratch(DType::i64, {n_tok});  // [n_tok] on ctx's device
    if (!dev)
        ops::upload(ctx, Tensor{pos_host.data(), DType::i64, Device::cpu, {n_tok}}, pos);

    detail::ProjectedViews p;
    p.q = scratch(DType::f32, {n_tok, m.n_head * m.d_qk()});
    p.c_kv = scratch(DType::f32, {n_tok, m.r_kv});
    p.k_r = scratch(DType::f32, {n_tok, m.d_r});
    if (m.r_q > 0)
        p.c_q = scratch(DType::f32, {n_tok, m.r_q});
    detail::mla_project(ctx, cfg, w, x, batch, pos, p);
    const bool dsa = spec.mixer == Mixer::dsa;
    Tensor q_idx, k_idx, w_idx;  // dsa: [n_tok, H_I·d_I], [n_tok, d_I], [n_tok, H_I]
    if (dsa) {
        ScopedTimer timer(indexer_seconds);
        const int64_t h_i = cfg.indexer.n_head, d_i = cfg.indexer.head_dim;
        q_idx = scratch(DType::f32, {n_tok, h_i * d_i});
        k_idx = scratch(DType::f32, {n_tok, d_i});
        w_idx = scratch(DType::f32, {n_tok, h_i});
        indexer_project(ctx, cfg, w.indexer, x, p.c_q, pos, q_idx, k_idx, w_idx);
    }

    // The caches as views, one a sequence, the new rows appended (every sequence's before any
    // attends: a sequence reads only its own pages, and never a shared page's rows past its
    // prefix), then every row's attention over its cache.
    std::vector<AttnCache> own(caches.empty() ? n_seq : 0);  // no caches: this call only
    std::vector<backend::LatentCache> views(static_cast<size_t>(n_seq));
    std::vector<std::vector<void*>> page_ptrs(static_cast<size_t>(n_seq));
    const std::vector<int32_t> row0s(static_cast<size_t>(n_tok), 0);  // block-table row 0
    const int64_t d_i = dsa ? cfg.indexer.head_dim : 0;
    for (int64_t s = 0; s < n_seq && !dev; ++s) {
        AttnCache& cache = caches.empty() ? own[s] : *caches[s];
        const int64_t row0 = batch.offsets[s], n_q = batch.length(s);
        if (n_q == 0)
            continue;
        views[s] = cache_view(cache, m, d_i, n_q, page_ptrs[s]);
        ops::latent_append(
            ctx,
            views[s],
            Tensor{const_cast<int32_t*>(row0s.data()), DType::i32, Device::cpu, {n_q}},
            Tensor{pos_host.data() + row0, DType::i64, Device::cpu, {n_q}},
            p.c_kv.rows(row0, n_q),
            p.k_r.rows(row0, n_q),
            dsa ? k_idx.rows(row0, n_q) : Tensor{});
        cache.n += n_q;
    }
    if (dev)
        ops::latent_append(
            ctx, dev->pages, dev->row_seq, pos, p.c_kv, p.k_r, dsa ? k_idx : Tensor{});
    Tensor o = scratch(DType::f32, {n_tok, m.n_head * m.d_v});
    ops::MlaAttendParams a;
    a.n_head = m.n_head;
    a.d_n = m.d_n;
    a.d_r = m.d_r;
    a.d_v = m.d_v;
    a.r_kv = m.r_kv;
    a.tau = static_cast<float>(mla_softmax_scale(cfg.mla));
    if (dsa) {
        a.idx_heads = cfg.indexer.n_head;
        a.idx_dim = cfg.indexer.head_dim;
        a.top_k = cfg.indexer.top_k;
        a.q_idx = q_idx;
        a.w_idx = w_idx;
    }
    a.form = form_of(mode);
    a.q = p.q;
    a.kv_b = w.kv_b_proj;
    a.o = o;
    a.n_seq = n_seq;
    a.offsets = batch.offsets.data();
    a.pos0 = batch.pos0.data();
    a.caches = dev ? &dev->pages : views.data();
    a.rows = dev ? &dev->rows : nullptr;
    if (tp != nullptr && tp->size() > 1)
        a.reduce = {reduce_over_tp, tp};
    // a device measures the indexer only when asked (a synchronisation each side)
    a.indexer_seconds = dev == nullptr || stats != nullptr ? &indexer_seconds : nullptr;
    ops::mla_attend(ctx, a);

    if (spec.gated) {  // u = o ⊙ σ(W_g x), σ in fp32
        Tensor g = scratch(DType::f32, {n_tok, m.n_head * m.d_v});
        ops::linear(ctx, x, w.g_proj, g);
        ops::sigmoid_inplace(ctx, g);
        ops::mul_inplace(ctx, o, g);
    }
    ops::linear(ctx, o, w.o_proj, y);
    lora_forward(ctx, lora.o, w.lora_views.o, batch, w.lora_rows, o, y);
    if (stats != nullptr) {
        ops::synchronize(ctx);  // a device's seconds are its work's, not its queueing's
        stats->indexer_seconds += indexer_seconds;
        stats->attention_seconds += wall_seconds() - start - indexer_seconds;
    }
}

}  // namespace hymoe::model
