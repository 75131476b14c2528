// LoRA adapter 0 held on a Ctx's device (model/lora_factors.h).
#include "hymoe/model/lora_factors.h"

#include "hymoe/backend/ops_attention.h"
#include "hymoe/backend/ops_bulk.h"
#include "hymoe/core/error.h"

namespace hymoe::model {

LoraFactors::LoraFactors(const backend::Ctx& ctx, const Model& m, LoraModel& lm)
    : ctx_(ctx), m_(m), lm_(lm) {
    for (const LoraModule& mod : lm.modules) {
        HYMOE_CHECK(!mod.slot->adapters.empty() && mod.slot->adapters[0].dA.view().data != nullptr,
                    "LoraFactors: ",
                    mod.name,
                    " has no trainable adapter 0");
        const LoraPair& p = mod.slot->adapters[0];
        Pair& d = pairs_[mod.slot];
        d.A = backend::Held(ctx, DType::f32, p.A.view().shape);
        d.B = backend::Held(ctx, DType::f32, p.B.view().shape);
        d.dA = backend::Held(ctx, DType::f32, p.A.view().shape);
        d.dB = backend::Held(ctx, DType::f32, p.B.view().shape);
        d.scale = p.scale;
    }
    upload_factors();
}

LoraSlotView LoraFactors::view_of(const LoraSlot* slot) const {
    const auto it = slot ? pairs_.find(slot) : pairs_.end();
    if (it == pairs_.end())
        return {};
    const Pair& p = it->second;
    return {LoraFactorsView{p.A.view(), p.B.view(), p.scale, p.dA.view(), p.dB.view(), slot}};
}

ModelViews LoraFactors::attach(ModelViews v) const {
    auto mlp = [&](const LoraSlots& s) {
        return MlpLoraViews{view_of(s.gate), view_of(s.up), view_of(s.down)};
    };
    auto mixer = [&](const LoraSlots& s) {
        return MixerLoraViews{
            view_of(s.q), view_of(s.k), view_of(s.v), view_of(s.kv), view_of(s.o)};
    };
    for (int i = m_.shard.first_layer; i < m_.shard.end_layer; ++i) {
        const LayerWeights& w = m_.layers[i];
        LayerViews& l = v.layers[i];
        HYMOE_CHECK(l.kda.lora == nullptr && l.mla.lora == nullptr && l.dense.lora == nullptr &&
                        l.moe.experts.lora.empty() && l.moe.shared.lora == nullptr,
                    "LoraFactors: views with host adapters");
        l.kda.lora_views = mixer(w.kda.lora);
        l.mla.lora_views = mixer(w.attn.lora);
        l.dense.lora_views = mlp(w.dense.lora);
        l.moe.shared.lora_views = mlp(w.moe.shared.lora);
        // the routed experts' entries: [E], or the held experts' slots (expert_slot)
        std::vector<MlpLoraViews>& experts = l.moe.experts.lora_views;
        experts.clear();
        for (size_t e = 0; e < w.moe.experts.size(); ++e) {
            MlpLoraViews ev = mlp(w.moe.experts[e].lora);
            const int slot = l.moe.expert_slot.empty() ? static_cast<int>(e) : l.moe.expert_slot[e];
            if (slot < 0 || (ev.gate.empty() && ev.up.empty() && ev.down.empty()))
                continue;
            experts.resize(l.moe.experts.up.size());
            experts[static_cast<size_t>(slot)] = std::move(ev);
        }
    }
    return v;
}

TrainableLora LoraFactors::trainable() const {
    TrainableLora t;
    for (const LoraModule& mod : lm_.modules) {
        const Pair& d = pairs_.at(mod.slot);
        t.factors.insert(t.factors.end(), {d.A.view(), d.B.view()});
        t.grads.insert(t.grads.end(), {d.dA.view(), d.dB.view()});
    }
    return t;
}

TrainableLora host_trainable(LoraModel& lm) {
    TrainableLora t;
    for (const LoraModule& mod : lm.modules) {
        LoraPair& p = mod.slot->adapters[0];
        t.factors.insert(t.factors.end(), {p.A.view(), p.B.view()});
        t.grads.insert(t.grads.end(), {p.dA.view(), p.dB.view()});
    }
    return t;
}

void LoraFactors::upload_factors() {
    for (const LoraModule& mod : lm_.modules) {
        const LoraPair& p = mod.slot->adapters[0];
        Pair& d = pairs_.at(mod.slot);
        ops::upload(ctx_, p.A.view(), d.A.view());
        ops::upload(ctx_, p.B.view(), d.B.view());
    }
}

void LoraFactors::download_factors() {
    std::vector<Tensor> dst = host_trainable(lm_).factors;
    ops::download_all(ctx_, trainable().factors, dst);
}

void LoraFactors::download_grads() {
    std::vector<Tensor> dst = host_trainable(lm_).grads;
    ops::download_all(ctx_, trainable().grads, dst);
}

}  // namespace hymoe::model
