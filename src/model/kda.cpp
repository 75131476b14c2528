// The KDA block (spec/model-math.md §3): weights, per-sequence state, and the forward over a packed
// batch. Projections run over all tokens at once; the conv (with its tails) and the recurrence run
// over the batch's sequence table (backend/kda_batch.h), each sequence continuing its KdaState.
// Every step is an op on the caller's Ctx (hymoe/backend/ops.h, ops_kda.h, kda_batch.h), so the
// forward on views (model/kda_views.h) runs on the CPU or, with device tensors and a device table,
// on a CUDA Ctx; adapters come as host slots (CPU) or factor views (model/lora_views.h).
#include "hymoe/model/kda.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <utility>

#include "hymoe/backend/kda_batch.h"
#include "hymoe/backend/ops.h"
#include "hymoe/backend/ops_attention.h"
#include "hymoe/backend/ops_kda.h"
#include "hymoe/core/error.h"
#include "hymoe/model/kda_views.h"
#include "hymoe/model/model.h"
#include "kda_dims.h"

namespace hymoe::model {

namespace {

// t's data as `shape` (as many elements), on t's device.
Tensor reshaped(const Tensor& t, Shape shape) {
    HYMOE_CHECK(t.numel() == shape_numel(shape),
                "kda_forward: a tensor of ",
                shape_string(t.shape),
                " used as ",
                shape_string(shape));
    return Tensor{t.data, t.dtype, t.device, std::move(shape)};
}

// The shortest sequence the recurrence runs chunked (KdaMode::automatic: any with more than one
// token in the call).
int64_t chunk_from(KdaMode mode) {
    static_assert(kPrefillAlign % 64 == 0, "model.h: kPrefillAlign, kda_chunked's chunk");
    return mode == KdaMode::chunked ? 0 : mode == KdaMode::automatic ? 2 : INT64_MAX;
}

}  // namespace

TensorList kda_tensors(const ModelConfig& cfg, KdaWeights* w) {
    const KdaDims n(cfg);  // H, D: this rank's heads under tp (model/shard.h)
    using W = KdaWeights;
    return in_block(WeightBlock::kda,
                    {
                        split(0, {"q_proj.weight", {n.D, n.d}, slot(w, &W::q_proj)}),
                        split(0, {"k_proj.weight", {n.D, n.d}, slot(w, &W::k_proj)}),
                        split(0, {"v_proj.weight", {n.D, n.d}, slot(w, &W::v_proj)}),
                        split(0, {"q_conv1d.weight", {n.D, 1, n.W}, slot(w, &W::q_conv1d)}),
                        split(0, {"k_conv1d.weight", {n.D, 1, n.W}, slot(w, &W::k_conv1d)}),
                        split(0, {"v_conv1d.weight", {n.D, 1, n.W}, slot(w, &W::v_conv1d)}),
                        {"f_a_proj.weight", {n.K, n.d}, slot(w, &W::f_a_proj)},
                        split(0, {"f_b_proj.weight", {n.D, n.K}, slot(w, &W::f_b_proj)}),
                        split(0, {"dt_bias", {n.D}, slot(w, &W::dt_bias), Init::kda_dt_bias}),
                        split(2, {"A_log", {1, 1, n.H, 1}, slot(w, &W::a_log), Init::kda_a_log}),
                        split(0, {"b_proj.weight", {n.H, n.d}, slot(w, &W::b_proj)}),
                        {"g_a_proj.weight", {n.K, n.d}, slot(w, &W::g_a_proj)},
                        split(0, {"g_b_proj.weight", {n.D, n.K}, slot(w, &W::g_b_proj)}),
                        {"o_norm.weight", {n.K}, slot(w, &W::o_norm), Init::ones},
                        split(1, {"o_proj.weight", {n.d, n.D}, slot(w, &W::o_proj)}),
                    });
}

KdaState make_kda_state(const ModelConfig& cfg) {
    const KdaDims n(cfg);
    KdaState st;
    st.S = Buffer(DType::f32, {n.H, n.K, n.K});
    st.q_tail = Buffer(DType::f32, {n.W - 1, n.D});
    st.k_tail = Buffer(DType::f32, {n.W - 1, n.D});
    st.v_tail = Buffer(DType::f32, {n.W - 1, n.D});
    return st;
}

KdaWeightViews kda_views(const KdaWeights& w) {
    return {w.q_proj.view(),
            w.k_proj.view(),
            w.v_proj.view(),
            w.q_conv1d.view(),
            w.k_conv1d.view(),
            w.v_conv1d.view(),
            w.f_a_proj.view(),
            w.f_b_proj.view(),
            w.dt_bias.view(),
            w.a_log.view(),
            w.b_proj.view(),
            w.g_a_proj.view(),
            w.g_b_proj.view(),
            w.o_norm.view(),
            w.o_proj.view(),
            &w.lora,
            {}};
}

KdaStateViews kda_views(KdaState& st) {
    return {st.S.view(), st.q_tail.view(), st.k_tail.view(), st.v_tail.view()};
}

void kda_forward(const backend::Ctx& ctx,
                 const ModelConfig& cfg,
                 const KdaWeights& w,
                 const Tensor& x,
                 const SeqBatch& batch,
                 const std::vector<KdaState*>& states,
                 Tensor& y,
                 KdaMode mode) {
    std::vector<KdaStateViews> views;
    views.reserve(states.size());
    for (KdaState* st : states) {
        HYMOE_CHECK(st != nullptr,
                    "kda_forward: a state not made by make_kda_state for this config");
        views.push_back(kda_views(*st));
    }
    kda_forward(ctx, cfg, kda_views(w), x, batch, views, y, mode);
}

KdaTableArrays kda_table_arrays(const SeqBatch& batch, const std::vector<KdaStateViews>& states) {
    const int64_t n_seq = batch.n_seq();
    HYMOE_CHECK(static_cast<int64_t>(states.size()) == n_seq &&
                    static_cast<int64_t>(batch.offsets.size()) == n_seq + 1,
                "kda_forward: ",
                states.size(),
                " states for a batch of ",
                n_seq,
                " sequences");
    KdaTableArrays a;
    a.offsets = batch.offsets;
    a.n_tok = batch.n_tok();
    a.row_seq.resize(static_cast<size_t>(a.n_tok));
    a.ptrs.resize(static_cast<size_t>(4 * n_seq));
    for (int64_t s = 0; s < n_seq; ++s) {
        a.max_len = std::max(a.max_len, batch.length(s));
        for (int64_t r = batch.offsets[s]; r < batch.offsets[s + 1]; ++r)
            a.row_seq[static_cast<size_t>(r)] = static_cast<int32_t>(s);
        const KdaStateViews& st = states[static_cast<size_t>(s)];
        a.ptrs[s] = st.S.ptr<float>();
        a.ptrs[n_seq + s] = st.q_tail.ptr<float>();
        a.ptrs[2 * n_seq + s] = st.k_tail.ptr<float>();
        a.ptrs[3 * n_seq + s] = st.v_tail.ptr<float>();
    }
    return a;
}

ops::KdaSeqTable kda_table_on(const backend::Ctx& ctx,
                              backend::Scratch& scratch,
                              const KdaTableArrays& arrays) {
    ops::KdaSeqTable t = arrays.table();
    auto put = [&](const auto& v, DType dtype) {
        const auto n = static_cast<int64_t>(v.size());
        Tensor dev = scratch(dtype, {n});
        ops::upload(
            ctx,
            Tensor{const_cast<void*>(static_cast<const void*>(v.data())), dtype, Device::cpu, {n}},
            dev);
        return dev.data;
    };
    static_assert(sizeof(float*) == sizeof(int64_t));  // the pointers travel as i64
    t.offsets = static_cast<const int64_t*>(put(arrays.offsets, DType::i64));
    t.row_seq = static_cast<const int32_t*>(put(arrays.row_seq, DType::i32));
    auto* const* ptrs = static_cast<float* const*>(put(arrays.ptrs, DType::i64));
    t.state = ptrs;
    for (int p = 0; p < 3; ++p)
        t.tail[p] = ptrs + (p + 1) * t.n_seq;
    return t;
}

ops::KdaSeqTable KdaTableArrays::table() const {
    ops::KdaSeqTable t;
    t.n_tok = n_tok;
    t.n_seq = static_cast<int64_t>(offsets.size()) - 1;
    t.max_len = max_len;
    t.offsets = offsets.data();
    t.row_seq = row_seq.data();
    t.state = ptrs.data();
    for (int p = 0; p < 3; ++p)
        t.tail[p] = ptrs.data() + (p + 1) * t.n_seq;
    return t;
}

void check_kda_states(const ModelConfig& cfg, const std::vector<KdaStateViews>& states) {
    const KdaDims n(cfg);
    for (const KdaStateViews& st : states)
        HYMOE_CHECK(st.S.shape == (Shape{n.H, n.K, n.K}) && st.S.dtype == DType::f32 &&
                        st.q_tail.numel() == (n.W - 1) * n.D &&
                        st.k_tail.numel() == st.q_tail.numel() &&
                        st.v_tail.numel() == st.q_tail.numel(),
                    "kda_forward: a state not made by make_kda_state for this config");
}

void kda_forward(const backend::Ctx& ctx,
                 const ModelConfig& cfg,
                 const KdaWeightViews& w,
                 const Tensor& x,
                 const SeqBatch& batch,
                 const std::vector<KdaStateViews>& states,
                 Tensor& y,
                 KdaMode mode) {
    check_kda_states(cfg, states);
    backend::Scratch scratch(ctx);
    const KdaTableArrays arrays = kda_table_arrays(batch, states);
    kda_forward(ctx, cfg, w, x, KdaBatchViews{&batch, kda_table_on(ctx, scratch, arrays)}, y, mode);
}

void kda_forward(const backend::Ctx& ctx,
                 const ModelConfig& cfg,
                 const KdaWeightViews& w,
                 const Tensor& x,
                 const KdaBatchViews& b,
                 Tensor& y,
                 KdaMode mode) {
    const KdaDims n(cfg);
    const int64_t n_tok = x.numel() / n.d;
    const SeqBatch& batch = *b.batch;
    const ops::KdaSeqTable& table = b.table;
    HYMOE_CHECK(x.shape == (Shape{n_tok, n.d}) && y.shape == x.shape && batch.n_tok() == n_tok &&
                    table.n_tok == n_tok && table.n_seq == batch.n_seq(),
                "kda_forward: x ",
                shape_string(x.shape),
                " y ",
                shape_string(y.shape),
                ", ",
                batch.n_tok(),
                " tokens in ",
                batch.n_seq(),
                " sequences, a table of ",
                table.n_tok,
                " rows in ",
                table.n_seq);
    const LoraSlots none;
    const LoraSlots& lora = w.lora ? *w.lora : none;
    const MixerLoraViews& lv = w.lora_views;
    // y += the adapters' share of x on one projection
    auto adapt = [&](LoraSlot* host, const LoraSlotView& views, const Tensor& in, Tensor& out) {
        lora_forward(ctx, host, views, batch, b.lora_rows, in, out);
    };
    backend::Scratch scratch(ctx);

    // q, k, v: projection → conv → SiLU → l2 per head (q also × K^{-1/2})
    Tensor proj = scratch(DType::f32, {n_tok, n.D});  // [n_tok, D] pre-conv, reused for q, k, v
    Tensor q = scratch(DType::f32, {n_tok, n.D});
    Tensor k = scratch(DType::f32, {n_tok, n.D});
    Tensor v = scratch(DType::f32, {n_tok, n.D});
    ops::linear(ctx, x, w.q_proj, proj);
    adapt(lora.q, lv.q, x, proj);
    ops::kda_conv_silu(ctx, table, proj, w.q_conv1d, 0, q);
    ops::linear(ctx, x, w.k_proj, proj);
    adapt(lora.k, lv.k, x, proj);
    ops::kda_conv_silu(ctx, table, proj, w.k_conv1d, 1, k);
    ops::linear(ctx, x, w.v_proj, proj);
    adapt(lora.v, lv.v, x, proj);
    ops::kda_conv_silu(ctx, table, proj, w.v_conv1d, 2, v);
    Tensor q_heads = reshaped(q, {n_tok * n.H, n.K}), k_heads = reshaped(k, {n_tok * n.H, n.K});
    ops::l2_norm_rows(ctx, q_heads);
    ops::l2_norm_rows(ctx, k_heads);
    ops::scale_inplace(ctx, q, 1.0f / std::sqrt(static_cast<float>(n.K)));

    // g = decay(f_b f_a x), β = σ(b_proj x)
    Tensor low = scratch(DType::f32, {n_tok, n.K});  // [n_tok, K] low-rank (decay, then gate)
    Tensor g = scratch(DType::f32, {n_tok, n.D});
    ops::linear(ctx, x, w.f_a_proj, low);
    ops::linear(ctx, low, w.f_b_proj, g);
    const auto& lb = cfg.kda.gate_lower_bound;
    ops::kda_decay_gate(ctx,
                        g,
                        reshaped(w.a_log, {n.H}),
                        w.dt_bias,
                        lb ? std::optional<float>(static_cast<float>(*lb)) : std::nullopt);
    Tensor beta = scratch(DType::f32, {n_tok, n.H});
    ops::linear(ctx, x, w.b_proj, beta);
    ops::sigmoid_inplace(ctx, beta);

    Tensor o = scratch(DType::f32, {n_tok, n.D});  // [n_tok, H, V]
    ops::KdaBatchScan p;
    p.n_head = static_cast<int>(n.H);
    p.d_k = p.d_v = static_cast<int>(n.K);
    p.q = q.ptr<float>();
    p.k = k.ptr<float>();
    p.v = v.ptr<float>();
    p.g = g.ptr<float>();
    p.beta = beta.ptr<float>();
    p.o = o.ptr<float>();
    p.chunk_from = chunk_from(mode);
    p.bf16_products = w.q_proj.dtype == DType::bf16;
    ops::kda_scan_batch(ctx, table, p);

    // y = o_proj(RMSNorm(o_h; o_norm) ⊙ σ(g_b g_a x))
    Tensor gate = scratch(DType::f32, {n_tok, n.D});
    ops::linear(ctx, x, w.g_a_proj, low);
    ops::linear(ctx, low, w.g_b_proj, gate);
    ops::sigmoid_inplace(ctx, gate);
    Tensor heads = reshaped(o, {n_tok * n.H, n.K});
    ops::rms_norm(ctx, heads, w.o_norm, static_cast<float>(cfg.rms_norm_eps), heads);
    ops::mul_inplace(ctx, o, gate);
    ops::linear(ctx, o, w.o_proj, y);
    adapt(lora.o, lv.o, o, y);
}

}  // namespace hymoe::model
