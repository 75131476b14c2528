// The model's LoRA adapters: target names → the blocks' projections and slots, the adapters'
// named factors (init, checkpoints, PEFT files) and merging into the base weights.
#include "hymoe/model/lora_model.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <utility>

#include "hymoe/backend/ops.h"
#include "hymoe/core/error.h"

namespace hymoe::model {

namespace {

// One projection a target can adapt: its weight, the slot pointer in its block, the projection
// name a target selects it by, and its group (routed or shared experts, or none).
struct Site {
    const Buffer* weight;
    LoraSlot** slot;
    std::string proj;   // q_proj, k_proj, v_proj, o_proj, kv (MLA's k/v), gate/up/down_proj
    std::string group;  // "", "experts" or "shared_experts"
    int expert_id = -1;
};

void mlp_sites(std::vector<Site>& out, DenseFfnWeights& w, const std::string& group, int e = -1) {
    if (w.gate_proj.view().data)
        out.push_back({&w.gate_proj, &w.lora.gate, "gate_proj", group, e});
    out.push_back({&w.up_proj, &w.lora.up, "up_proj", group, e});
    out.push_back({&w.down_proj, &w.lora.down, "down_proj", group, e});
}

// Every adaptable projection of layer i on this rank.
std::vector<Site> layer_sites(const LayerSpec& spec, LayerWeights& lw, bool mla_q_latent) {
    std::vector<Site> s;
    if (spec.mixer == Mixer::kda) {
        s.push_back({&lw.kda.q_proj, &lw.kda.lora.q, "q_proj", ""});
        s.push_back({&lw.kda.k_proj, &lw.kda.lora.k, "k_proj", ""});
        s.push_back({&lw.kda.v_proj, &lw.kda.lora.v, "v_proj", ""});
        s.push_back({&lw.kda.o_proj, &lw.kda.lora.o, "o_proj", ""});
    } else {
        Buffer* q = mla_q_latent ? &lw.attn.q_b_proj : &lw.attn.q_proj;
        s.push_back({q, &lw.attn.lora.q, "q_proj", ""});
        s.push_back({&lw.attn.kv_a_proj_with_mqa, &lw.attn.lora.kv, "kv", ""});
        s.push_back({&lw.attn.o_proj, &lw.attn.lora.o, "o_proj", ""});
    }
    if (spec.ffn == Ffn::dense) {
        mlp_sites(s, lw.dense, "");
        return s;
    }
    for (size_t e = 0; e < lw.moe.experts.size(); ++e)
        if (lw.moe.experts[e].up_proj.view().data)
            mlp_sites(s, lw.moe.experts[e], "experts", static_cast<int>(e));
    if (lw.moe.shared.up_proj.view().data)
        mlp_sites(s, lw.moe.shared, "shared_experts");
    return s;
}

// Whether target name t selects a site (the table in lora_model.h).
bool selects(const std::string& t, const Site& s) {
    if (s.group == "experts")
        return t == "experts";
    if (s.group == "shared_experts" && t == "shared_experts")
        return true;
    if (s.proj == "kv")
        return t == "k_proj" || t == "v_proj";
    return t == s.proj;
}

std::string module_of(const std::string& weight_name) {
    return weight_name.substr(0, weight_name.size() - std::string(".weight").size());
}

// "model.layers.5.mlp.experts.7.w1" → "model.layers.5.mlp.experts.{e}.w1" parts around the id.
std::string expert_module(const std::string& module, int e, const std::string& id) {
    const std::string key = "experts." + std::to_string(e) + ".";
    const size_t at = module.find(key);
    HYMOE_CHECK(at != std::string::npos, "lora: expert module ", module, " has no ", key);
    return module.substr(0, at) + "experts." + id + "." + module.substr(at + key.size());
}

}  // namespace

LoraModel attach_lora(Model& m,
                      const std::vector<std::string>& targets,
                      bool per_expert,
                      bool every_target) {
    std::map<const Buffer*, TensorSpec> specs;  // weight → its spec (name, local shape, split)
    for (TensorSpec& t : model_tensors(m))
        specs[t.dest] = t;
    LoraModel lm;
    std::set<std::string> matched;
    const int64_t n_expert = m.cfg.moe.n_routed_experts;
    for (int i = m.shard.first_layer; i < m.shard.end_layer; ++i) {
        std::map<std::string, size_t> shared;  // per projection: the layer's expert adapter
        const bool q_latent = m.local.mla.q_lora_rank > 0;
        for (const Site& site : layer_sites(m.local.layers[i], m.layers[i], q_latent)) {
            bool take = false;
            for (const std::string& t : targets)
                if (selects(t, site))
                    take = true, matched.insert(t);
            if (!take)
                continue;
            const TensorSpec& w = specs.at(site.weight);
            const std::string module = module_of(w.name);
            if (site.group == "experts" && !per_expert) {
                auto [at, first] = shared.try_emplace(site.proj, lm.modules.size());
                if (!first) {  // one more hosted expert under the layer's adapter
                    lm.modules[at->second].adapted.push_back(w.dest);
                    *site.slot = lm.modules[at->second].slot;
                    continue;
                }
                const std::string proj = module.substr(module.rfind('.') + 1);
                LoraModule& added = lm.modules.emplace_back();
                added.name = module.substr(0, module.rfind("experts.") + 8) + proj;
                for (int64_t e = 0; e < n_expert; ++e)
                    added.peft_names.push_back(
                        expert_module(module, site.expert_id, std::to_string(e)));
            } else {
                LoraModule& added = lm.modules.emplace_back();
                added.name = module;
                added.peft_names = {module};
            }
            LoraModule& mod = lm.modules.back();
            mod.weight = w;
            mod.adapted = {w.dest};
            mod.layer = i;
            mod.expert = site.group == "experts";
            mod.slot = &lm.new_slot();
            mod.slot->dropout_stream = name_stream(mod.name);
            *site.slot = mod.slot;
        }
    }
    for (const std::string& t : targets)
        if (every_target && !matched.count(t))
            HYMOE_FAIL(Exit::invalid,
                       "finetune.lora.target_modules: ",
                       t,
                       " matches no projection of this model on its layers here");
    return lm;
}

namespace {

// A module's factors as named tensors: A [r, in] and B [out, r] (local shapes), cut like the
// weight (its input split → A's columns; its output split → B's rows), pointing at a and b.
std::pair<TensorSpec, TensorSpec> factor_specs(const LoraModule& mod,
                                               int64_t r,
                                               Buffer* a,
                                               Buffer* b) {
    const Shape& w = mod.weight.shape;  // [out, in] local
    std::pair<TensorSpec, TensorSpec> f{{mod.name + ".lora_A.weight", {r, w[1]}, a},
                                        {mod.name + ".lora_B.weight", {w[0], r}, b}};
    if (mod.weight.split_dim == 1)
        f.first = split(1, f.first, mod.weight.split_over);
    else if (mod.weight.split_dim == 0)
        f.second = split(0, f.second, mod.weight.split_over);
    return f;
}

}  // namespace

TensorList LoraModel::tensors(int adapter, bool grads) {
    TensorList list;
    for (const LoraModule& mod : modules) {
        LoraPair& p = mod.slot->adapters.at(adapter);
        auto [a, b] =
            factor_specs(mod, p.A.view().dim(0), grads ? &p.dA : &p.A, grads ? &p.dB : &p.B);
        list.push_back(std::move(a));
        list.push_back(std::move(b));
    }
    return list;
}

void add_lora_adapter(
    LoraModel& lm, const ModelShard& shard, int rank, float scale, uint64_t seed, bool trainable) {
    TensorList init;
    for (LoraModule& mod : lm.modules) {
        LoraPair& p = mod.slot->adapters.emplace_back();
        p.scale = scale;
        auto [a, b] = factor_specs(mod, rank, &p.A, &p.B);
        const int64_t in_whole =  // A: Kaiming-uniform over the whole input width
            a.shape[1] * (a.split_dim == 1 ? shard.parts(a.split_over) : 1);
        a.init = Init::uniform;
        a.std = 1.0f / std::sqrt(static_cast<float>(in_whole));
        b.init = Init::zeros;
        init.push_back(a);
        init.push_back(b);
        if (trainable) {
            p.dA = Buffer(DType::f32, a.shape);
            p.dB = Buffer(DType::f32, b.shape);
        }
    }
    init_tensors_random(init, shard, seed);
}

int64_t lora_local_params(LoraModel& lm) {
    int64_t n = 0;
    for (const TensorSpec& t : lm.tensors(0))
        n += shape_numel(t.shape);
    return n;
}

void merge_lora(LoraModel& lm, int adapter) {
    for (LoraModule& mod : lm.modules) {
        const LoraPair& p = mod.slot->adapters.at(adapter);
        const Shape& w = mod.weight.shape;
        const int64_t r = p.A.view().dim(0);
        for (Buffer* weight : mod.adapted) {  // W [out, in] += s · B [out, r] · A [r, in]
            Tensor& wt = weight->view();      // in fp32, then back to its storage dtype
            std::vector<float> x = widened(wt);
            ops::gemm(false,
                      false,
                      w[0],
                      w[1],
                      r,
                      p.scale,
                      p.B.ptr<float>(),
                      r,
                      p.A.ptr<float>(),
                      w[1],
                      1.0f,
                      x.data(),
                      w[1]);
            store_floats(x.data(), wt.numel(), wt.dtype, wt.data);
        }
    }
    for (LoraModule& mod : lm.modules)
        mod.slot->adapters.clear();
}

}  // namespace hymoe::model
