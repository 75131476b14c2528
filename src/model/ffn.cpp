// FFN weights by family (HF names, model-math §6-7), and the one MLP every FFN path runs on host
// weights: model/ffn_views.h's dense_ffn_forward on their views.
#include "hymoe/model/ffn.h"

#include <string>

#include "hymoe/model/ffn_views.h"

namespace hymoe::model {

namespace {

// The HF names of one MLP's matrices: {gate, up, down}.
struct MlpNames {
    const char* gate;
    const char* up;
    const char* down;
};

constexpr MlpNames hf_names{"gate_proj", "up_proj", "down_proj"};
constexpr MlpNames kimi_expert_names{"w1", "w3", "w2"};  // KimiBlockSparseMLP

// Append the matrices of one MLP of width `inter` on inputs of width `width` (relu2: no gate),
// its width cut over `over` (gate and up by rows, down by columns), `count` of them stacked when
// there are no weights to fill (w null), in `block`.
void add_mlp(TensorList& list,
             const std::string& prefix,
             const MlpNames& names,
             ExpertAct act,
             int64_t inter,
             int64_t width,
             DenseFfnWeights* w,
             SplitOver over,
             WeightBlock block,
             int64_t count = 1) {
    auto add = [&](int dim, const char* name, Shape shape, Buffer DenseFfnWeights::*member) {
        TensorSpec spec = split(dim, {prefix + name + ".weight", shape, slot(w, member)}, over);
        spec.block = block;
        spec.count = count;
        list.push_back(std::move(spec));
    };
    if (act == ExpertAct::swiglu)
        add(0, names.gate, {inter, width}, &DenseFfnWeights::gate_proj);
    add(0, names.up, {inter, width}, &DenseFfnWeights::up_proj);
    add(1, names.down, {width, inter}, &DenseFfnWeights::down_proj);
}

const MlpNames& expert_names(const ModelConfig& cfg) {
    return cfg.model_type == "kimi_linear" ? kimi_expert_names : hf_names;
}

int64_t expert_width(const ModelConfig& cfg, const LayerSpec& spec) {
    return spec.ffn == Ffn::latent_moe ? cfg.moe.latent_size : cfg.hidden_size;
}

}  // namespace

TensorList routed_expert_tensors(const ModelConfig& cfg,
                                 const LayerSpec& spec,
                                 MoeWeights& moe,
                                 const std::vector<int>& experts) {
    const MoeConfig& m = cfg.moe;
    moe.experts.resize(static_cast<size_t>(m.n_routed_experts));  // before pointers into it
    TensorList list;
    for (int e : experts)
        add_mlp(list,
                "experts." + std::to_string(e) + ".",
                expert_names(cfg),
                m.expert_act,
                m.moe_intermediate,
                expert_width(cfg, spec),
                &moe.experts[static_cast<size_t>(e)],
                SplitOver::etp,
                WeightBlock::routed_experts);
    return list;
}

TensorList ffn_tensors(const ModelConfig& cfg,
                       const LayerSpec& spec,
                       DenseFfnWeights* dense,
                       MoeWeights* moe,
                       const std::vector<int>* hosted) {
    const int64_t d = cfg.hidden_size;
    TensorList list;
    if (spec.ffn == Ffn::dense) {
        add_mlp(list,
                "",
                hf_names,
                ExpertAct::swiglu,
                cfg.intermediate_size,
                d,
                dense,
                SplitOver::tp,
                WeightBlock::dense_ffn);
        return list;
    }
    const MoeConfig& m = cfg.moe;
    const int64_t width = expert_width(cfg, spec);  // experts run in the latent (§7)
    auto add = [&](WeightBlock block, TensorSpec t) {
        t.block = block;
        list.push_back(std::move(t));
    };
    TensorSpec gate{"gate.weight", {m.n_routed_experts, d}, slot(moe, &MoeWeights::gate)};
    gate.keep_f32 = true;  // the router stays fp32 (model-math §10)
    add(WeightBlock::router, gate);
    if (m.correction_bias)
        add(WeightBlock::router,
            {"gate.e_score_correction_bias",
             {m.n_routed_experts},
             slot(moe, &MoeWeights::correction_bias),
             Init::small_bias});
    if (spec.ffn == Ffn::latent_moe) {
        add(WeightBlock::latent_proj,
            {"fc1_latent_proj.weight", {width, d}, slot(moe, &MoeWeights::fc1_latent_proj)});
        add(WeightBlock::latent_proj,
            {"fc2_latent_proj.weight", {d, width}, slot(moe, &MoeWeights::fc2_latent_proj)});
    }
    if (moe) {
        std::vector<int> all;
        if (!hosted) {
            for (int e = 0; e < m.n_routed_experts; ++e)
                all.push_back(e);
            hosted = &all;
        }
        TensorList routed = routed_expert_tensors(cfg, spec, *moe, *hosted);
        list.insert(list.end(), routed.begin(), routed.end());
    } else {  // the hosted experts' matrices stacked, "experts.*." standing for each id
        add_mlp(list,
                "experts.*.",
                expert_names(cfg),
                m.expert_act,
                m.moe_intermediate,
                width,
                nullptr,
                SplitOver::etp,
                WeightBlock::routed_experts,
                hosted ? static_cast<int64_t>(hosted->size()) : m.n_routed_experts);
    }
    if (m.n_shared_experts > 0)
        add_mlp(list,
                "shared_experts.",
                hf_names,
                m.expert_act,
                m.shared_intermediate,
                d,
                moe ? &moe->shared : nullptr,
                SplitOver::tp,
                WeightBlock::shared_experts);
    return list;
}

void dense_ffn_forward(const backend::Ctx& ctx,
                       const DenseFfnWeights& w,
                       ExpertAct act,
                       const Tensor& x /*[n_tok, w]*/,
                       Tensor& y /*[n_tok, w]*/,
                       const SeqBatch* row_batch) {
    dense_ffn_forward(ctx, ffn_views(w), act, x, y, row_batch);
}

}  // namespace hymoe::model
