// LoRA adapters on the model on a device (device_lora.h): the upload of every slot's factors and
// the step's rows per adapter.
#include "device_lora.h"

#include <algorithm>

#include "device_runtime.h"
#include "hymoe/core/error.h"
#include "hymoe/model/lora.h"

namespace hymoe::model::dev {

namespace {

// A host slot's adapters on the device (null slot: none).
LoraSlotW upload_slot(const backend::Ctx& ctx, Keep& keep, const LoraSlot* slot) {
    LoraSlotW out;
    if (slot == nullptr)
        return out;
    HYMOE_CHECK(slot->dropout == 0.0f,
                "device model: a LoRA slot with dropout ",
                slot->dropout,
                " (inference runs none)");
    for (const LoraPair& p : slot->adapters) {
        LoraW& w = out.emplace_back();
        w.scale = p.scale;
        if (p.A.view().data == nullptr)
            continue;
        w.A = upload_weight(ctx, keep, p.A, DType::f32);
        w.B = upload_weight(ctx, keep, p.B, DType::f32);
    }
    return out;
}

MlpLoraW upload_mlp(const backend::Ctx& ctx, Keep& keep, const LoraSlots& s) {
    return {upload_slot(ctx, keep, s.gate),
            upload_slot(ctx, keep, s.up),
            upload_slot(ctx, keep, s.down)};
}

int adapters_of(const MlpLoraW& m) {
    return static_cast<int>(std::max({m.gate.size(), m.up.size(), m.down.size()}));
}

int adapters_of(const MixerLoraW& m) {
    return static_cast<int>(
        std::max({m.q.size(), m.k.size(), m.v.size(), m.kv.size(), m.o.size()}));
}

}  // namespace

int upload_layer_lora(
    const backend::Ctx& ctx, Keep& keep, const LayerWeights& host, LayerViews& w, MoeW& moe) {
    const LoraSlots& kda = host.kda.lora;
    const LoraSlots& attn = host.attn.lora;
    w.kda.lora_views = {upload_slot(ctx, keep, kda.q),
                        upload_slot(ctx, keep, kda.k),
                        upload_slot(ctx, keep, kda.v),
                        upload_slot(ctx, keep, kda.kv),
                        upload_slot(ctx, keep, kda.o)};
    w.mla.lora_views = {upload_slot(ctx, keep, attn.q),
                        upload_slot(ctx, keep, attn.k),
                        upload_slot(ctx, keep, attn.v),
                        upload_slot(ctx, keep, attn.kv),
                        upload_slot(ctx, keep, attn.o)};
    HYMOE_CHECK(
        w.kda.lora_views.kv.empty() && w.mla.lora_views.k.empty() && w.mla.lora_views.v.empty(),
        "device model: a LoRA slot on a projection its block does not have");
    w.dense.lora_views = upload_mlp(ctx, keep, host.dense.lora);
    moe.shared.lora_views = upload_mlp(ctx, keep, host.moe.shared.lora);
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
        moe.experts.lora_views.push_back(upload_mlp(ctx, keep, e.lora));
        n = std::max(n, adapters_of(moe.experts.lora_views.back()));
        any_expert = any_expert || adapters_of(moe.experts.lora_views.back()) > 0;
    }
    HYMOE_CHECK(host.moe.experts.empty() || moe.experts.lora_views.size() == moe.experts.up.size(),
                "device model: ",
                moe.experts.lora_views.size(),
                " routed experts with adapters where the layer holds ",
                moe.experts.up.size());
    if (!any_expert)
        moe.experts.lora_views.clear();
    return n;
}

std::vector<std::vector<AdapterRowsW>> upload_lora_rows(const backend::Ctx& ctx,
                                                        backend::Scratch& s,
                                                        std::vector<Buffer>& staged,
                                                        const LoraRows& r,
                                                        int64_t n_groups) {
    std::vector<std::vector<AdapterRowsW>> out(static_cast<size_t>(n_groups));
    if (r.rows.empty())
        return out;
    const Tensor all = upload_values(ctx, s, staged, r.rows, DType::i64);  // [Σ m]
    for (const LoraSegment& seg : r.segments) {
        HYMOE_CHECK(seg.group >= 0 && seg.group < n_groups,
                    "upload_lora_rows: group ",
                    seg.group,
                    " of ",
                    n_groups);
        out[static_cast<size_t>(seg.group)].push_back(
            {seg.adapter, Tensor{at(all, seg.begin), DType::i64, all.device, {seg.count}}});
    }
    return out;
}

}  // namespace hymoe::model::dev
