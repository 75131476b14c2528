// The plan's weights: the weight list (model/tensor_list.h) summed by block, for the whole model
// and for one rank of each stage (split over tp, etp and ep or replicated as model/shard.h cuts
// them), and the LoRA adapters a rank trains. At one rank the per-block sums equal
// model::count_params exactly (tests/unit/runtime/test_plan.cpp), and the LoRA count the adapters
// model::attach_lora makes (test_plan_lora.cpp).
#include <algorithm>

#include "plan_detail.h"

namespace hymoe::runtime::detail {

// ---- LoRA ---------------------------------------------------------------------------------------

LoraCount lora_params(const ModelConfig& m,
                      const parallel::Layout& l,
                      const deck::LoraSection& lora,
                      int first,
                      int n_layer) {
    auto has = [&](const char* t) {
        return std::find(lora.target_modules.begin(), lora.target_modules.end(), t) !=
               lora.target_modules.end();
    };
    const i64 r = lora.rank, d = m.hidden_size, tp = l.tp, etp = l.etp;
    auto col = [&](i64 in, i64 out, i64 split) { return r * in + out * r / split; };
    auto row = [&](i64 in, i64 out, i64 split) { return r * in / split + out * r; };
    auto mlp = [&](i64 width, i64 inter, i64 split, ExpertAct act, bool all) {
        i64 n = 0;
        if (act == ExpertAct::swiglu && (all || has("gate_proj")))
            n += col(width, inter, split);
        if (all || has("up_proj"))
            n += col(width, inter, split);
        if (all || has("down_proj"))
            n += row(inter, width, split);
        return n;
    };
    LoraCount c;
    for (int i = first; i < first + n_layer; ++i) {
        const LayerSpec& s = m.layers[i];
        if (s.mixer == Mixer::kda) {
            const i64 D = static_cast<i64>(m.kda.n_head) * m.kda.head_dim;
            for (const char* t : {"q_proj", "k_proj", "v_proj"})
                c.dense += has(t) ? col(d, D, tp) : 0;
            c.dense += has("o_proj") ? row(D, d, tp) : 0;
        } else {
            const model::MlaConfig& a = m.mla;
            const i64 H = a.n_head, dq = a.qk_nope_head_dim + a.qk_rope_head_dim;
            c.dense += has("q_proj") ? col(a.q_lora_rank > 0 ? a.q_lora_rank : d, H * dq, tp) : 0;
            // k_proj and v_proj both mean one adapter on kv_a_proj_with_mqa (model/lora_model.h)
            c.dense +=
                has("k_proj") || has("v_proj") ? col(d, a.kv_lora_rank + a.qk_rope_head_dim, 1) : 0;
            c.dense += has("o_proj") ? row(H * a.v_head_dim, d, tp) : 0;
        }
        if (s.ffn == Ffn::dense) {
            c.dense += mlp(d, m.intermediate_size, tp, ExpertAct::swiglu, false);
            continue;
        }
        if (m.moe.shared_intermediate > 0)
            c.dense +=
                mlp(d, m.moe.shared_intermediate, tp, m.moe.expert_act, has("shared_experts"));
        if (has("experts")) {
            i64 one = mlp(expert_width(m, s), m.moe.moe_intermediate, etp, m.moe.expert_act, true);
            c.expert += lora.per_expert ? one * (m.moe.n_routed_experts / l.ep) : one;
        }
    }
    return c;
}

// ---- per-stage and whole-model weights: sums of the weight list -------------------------------

namespace {

// Whether a weight is held in fp32 at any model.dtype (model/weights.h stored_matrix; the vision
// tower's vectors are counted at model.dtype).
bool held_f32(const model::TensorSpec& t) {
    return t.block != PlanBlock::vision && !model::stored_matrix(t);
}

void add(LayerParams& lp, const model::TensorList& list) {
    for (const model::TensorSpec& t : list) {
        lp.params[idx(t.block)] += t.numel();
        lp.f32 += held_f32(t) ? t.numel() : 0;
        if (t.block == PlanBlock::routed_experts)
            lp.expert += shape_numel(t.shape);
        if (t.block == PlanBlock::router && t.shape.size() == 2)
            lp.router_gate += t.numel();
    }
}

// The weight list of the part sh summed: the tensors outside its layers (embedding, vision, final
// norm, head) in `rest`, and per layer, each kind of layer (LayerSpec) described once per cut.
std::vector<LayerParams> sum_weights(const ModelConfig& m,
                                     const model::ModelShard& sh,
                                     LayerKinds& kinds,
                                     LayerParams& rest) {
    model::ModelShard outside = sh;
    outside.end_layer = sh.first_layer;
    add(rest, model::weight_list(m, outside));
    std::vector<LayerParams> layers;
    for (int i = sh.first_layer; i < sh.end_layer; ++i) {
        const LayerSpec& s = m.layers[i];
        auto k =
            std::find_if(kinds.begin(), kinds.end(), [&](const auto& x) { return x.first == s; });
        if (k == kinds.end()) {
            kinds.emplace_back(s, LayerParams{});
            add(kinds.back().second, model::layer_weight_list(m, sh, i));
            k = kinds.end() - 1;
        }
        layers.push_back(k->second);
    }
    return layers;
}

}  // namespace

std::vector<LayerParams> stage_weights(const ModelConfig& m,
                                       const parallel::Layout& l,
                                       StagePlan& sp,
                                       LayerKinds& kinds) {
    parallel::Coords me;
    me.pp = sp.stage;
    LayerParams all;
    const std::vector<LayerParams> layers = sum_weights(m, model::make_shard(m, l, me), kinds, all);
    for (const LayerParams& lp : layers)
        for (size_t b = 0; b < all.params.size(); ++b)
            all.params[b] += lp.params[b];
    for (const LayerParams& lp : layers)
        all.f32 += lp.f32;
    sp.params = all.params;
    sp.f32_params = all.f32;
    for (int i = sp.first_layer; i < sp.first_layer + sp.n_layer; ++i) {
        const LayerSpec& s = m.layers[i];
        sp.n_kda += s.mixer == Mixer::kda;
        sp.n_mla += s.mixer == Mixer::mla;
        sp.n_dsa += s.mixer == Mixer::dsa;
        sp.n_dense += s.ffn == Ffn::dense;
        sp.n_moe += s.ffn != Ffn::dense;
    }
    return layers;
}

void model_weights(const ModelConfig& m, Plan& plan) {
    LayerParams all;
    LayerKinds kinds;
    i64 active_experts = 0;  // top_k of each MoE layer's routed experts
    for (const LayerParams& lp : sum_weights(m, model::whole_model(m), kinds, all)) {
        for (size_t b = 0; b < all.params.size(); ++b)
            all.params[b] += lp.params[b];
        active_experts += m.moe.top_k * lp.expert;
    }
    plan.model_params = all.params;
    plan.total_params = 0;
    for (i64 n : all.params)
        plan.total_params += n;
    plan.active_params = plan.total_params - all.params[idx(PlanBlock::vision)] -
                         all.params[idx(PlanBlock::routed_experts)] + active_experts;
}

}  // namespace hymoe::runtime::detail
