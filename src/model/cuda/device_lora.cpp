// LoRA adapters on the GPU model (device_lora.h): the upload of every slot's factors and the
// adapter's share of a projection on gathered rows.
#include "device_lora.h"

#include <algorithm>

#include "device_blocks.h"
#include "hymoe/core/error.h"
#include "hymoe/model/lora.h"

namespace hymoe::model::gpu {

namespace {

// A host slot's adapters on the device (null slot: none).
LoraSlotW upload_slot(Gpu& g, const LoraSlot* slot) {
    LoraSlotW out;
    if (slot == nullptr)
        return out;
    HYMOE_CHECK(slot->dropout == 0.0f,
                "GPU model: a LoRA slot with dropout ",
                slot->dropout,
                " (inference runs none)");
    for (const LoraPair& p : slot->adapters) {
        LoraW& w = out.emplace_back();
        w.scale = p.scale;
        if (p.A.view().data == nullptr)
            continue;
        w.A = upload_weight(g, p.A, DType::f32);
        w.B = upload_weight(g, p.B, DType::f32);
    }
    return out;
}

MlpLoraW upload_mlp(Gpu& g, const LoraSlots& s) {
    return {upload_slot(g, s.gate), upload_slot(g, s.up), upload_slot(g, s.down)};
}

int adapters_of(const MlpLoraW& m) {
    return static_cast<int>(std::max({m.gate.size(), m.up.size(), m.down.size()}));
}

int adapters_of(const MixerLoraW& m) {
    return static_cast<int>(
        std::max({m.q.size(), m.k.size(), m.v.size(), m.kv.size(), m.o.size()}));
}

}  // namespace

int upload_layer_lora(Gpu& g, const LayerWeights& host, LayerViews& w, MoeW& moe) {
    const LoraSlots& kda = host.kda.lora;
    const LoraSlots& attn = host.attn.lora;
    w.kda.lora_views = {upload_slot(g, kda.q),
                        upload_slot(g, kda.k),
                        upload_slot(g, kda.v),
                        upload_slot(g, kda.kv),
                        upload_slot(g, kda.o)};
    w.mla.lora_views = {upload_slot(g, attn.q),
                        upload_slot(g, attn.k),
                        upload_slot(g, attn.v),
                        upload_slot(g, attn.kv),
                        upload_slot(g, attn.o)};
    HYMOE_CHECK(
        w.kda.lora_views.kv.empty() && w.mla.lora_views.k.empty() && w.mla.lora_views.v.empty(),
        "GPU model: a LoRA slot on a projection its block does not have");
    w.dense.lora_views = upload_mlp(g, host.dense.lora);
    moe.shared.lora_views = upload_mlp(g, host.moe.shared.lora);
    int n = std::max({adapters_of(w.kda.lora_views),
                      adapters_of(w.mla.lora_views),
                      adapters_of(w.dense.lora_views),
                      adapters_of(moe.shared.lora_views)});
    // the routed experts' adapters by entry of moe.experts (the held experts, ids ascending: at
    // ep > 1 the rank's hosted ones, as moe_weights stacks them)
    moe.experts.lora_views.clear();
    bool any_expert = false;
    for (const DenseFfnWeights& e : host.moe.experts) {
        if (e.up_proj.view().data == nullptr)
            continue;  // hosted on another ep rank
        moe.experts.lora_views.push_back(upload_mlp(g, e.lora));
        n = std::max(n, adapters_of(moe.experts.lora_views.back()));
        any_expert = any_expert || adapters_of(moe.experts.lora_views.back()) > 0;
    }
    HYMOE_CHECK(host.moe.experts.empty() || moe.experts.lora_views.size() == moe.experts.up.size(),
                "GPU model: ",
                moe.experts.lora_views.size(),
                " routed experts with adapters where the layer holds ",
                moe.experts.up.size());
    if (!any_expert)
        moe.experts.lora_views.clear();
    return n;
}

std::vector<std::vector<AdapterRowsW>> upload_lora_rows(Gpu& g,
                                                        Scratch& s,
                                                        const LoraRows& r,
                                                        int64_t n_groups) {
    std::vector<std::vector<AdapterRowsW>> out(static_cast<size_t>(n_groups));
    if (r.rows.empty())
        return out;
    const Tensor all = upload_values(g, s, r.rows, DType::i64);  // [Σ m]
    for (const LoraSegment& seg : r.segments) {
        HYMOE_CHECK(seg.group >= 0 && seg.group < n_groups,
                    "upload_lora_rows: group ",
                    seg.group,
                    " of ",
                    n_groups);
        out[static_cast<size_t>(seg.group)].push_back(
            {seg.adapter, Tensor{at(all, seg.begin), DType::i64, Device::cuda, {seg.count}}});
    }
    return out;
}

void lora_apply(Gpu& g,
                const LoraSlotW& slot,
                const std::vector<AdapterRowsW>& rows,
                const Tensor& x,
                Tensor& y,
                int64_t y_col0,
                int64_t b_row0,
                int64_t n_out) {
    for (const AdapterRowsW& ar : rows) {
        if (ar.adapter < 0 || ar.adapter >= static_cast<int>(slot.size()) ||
            slot[static_cast<size_t>(ar.adapter)].A.data == nullptr)
            continue;
        const LoraW& p = slot[static_cast<size_t>(ar.adapter)];
        const int64_t m = ar.rows.dim(0), r = p.A.dim(0), in = p.A.dim(1), width = y.dim(1);
        const int64_t out = n_out < 0 ? p.B.dim(0) - b_row0 : n_out;
        HYMOE_CHECK(x.dim(1) == in && x.dim(0) == y.dim(0) && b_row0 + out <= p.B.dim(0) &&
                        y_col0 + out <= width,
                    "lora_apply: x ",
                    shape_string(x.shape),
                    ", y ",
                    shape_string(y.shape),
                    ", A ",
                    shape_string(p.A.shape),
                    ", B ",
                    shape_string(p.B.shape));
        Scratch s(g.arena);
        Tensor xg = s(x.dtype, {m, in});  // [m, in] the adapter's rows of x
        cu::gather_rows(g.stream, x, ar.rows, xg);
        Tensor t = s(DType::f32, {m, r});  // [m, r] = x Aᵀ
        g.blas.linear(in_dtype(g, s, xg, DType::f32), p.A, t);
        Tensor yg = s(y.dtype, {m, width});  // [m, w] their rows of y
        cu::gather_rows(g.stream, y, ar.rows, yg);
        Tensor yf = in_dtype(g, s, yg, DType::f32);
        g.blas.gemm(DType::f32,  // yf[:, col0 : col0 + out] += s · t B[b0 : b0 + out]ᵀ
                    DType::f32,
                    false,
                    true,
                    m,
                    out,
                    r,
                    p.scale,
                    t.data,
                    r,
                    at(p.B, b_row0 * r),
                    r,
                    1.0f,
                    at(yf, y_col0),
                    width);
        if (yf.data != yg.data)
            cu::cast(g.stream, yf, yg);
        cu::scatter_rows(g.stream, yg, ar.rows, y);
    }
}

}  // namespace hymoe::model::gpu
