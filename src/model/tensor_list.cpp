// The model's weights as one list (hymoe/model/tensor_list.h): the HF names of each family around
// the blocks' own lists, unbound for counting and planning or bound to a Model's buffers
// (model_tensors, expert_tensors), and count_params as its sum.
#include "hymoe/model/tensor_list.h"

#include "hymoe/model/model.h"

namespace hymoe::model {

namespace {

// Prefix of a layer's mixer and FFN weights in the HF checkpoints of each family.
std::string layer_prefix(int i) {
    return "model.layers." + std::to_string(i) + ".";
}

std::string ffn_prefix(const ModelConfig& cfg, int i) {
    const bool kimi_moe = cfg.model_type == "kimi_linear" && cfg.layers[i].ffn != Ffn::dense;
    return layer_prefix(i) + (kimi_moe ? "block_sparse_moe." : "mlp.");
}

void append(TensorList& out, TensorList part, const std::string& prefix) {
    for (TensorSpec& s : part) {
        s.name = prefix + s.name;
        out.push_back(std::move(s));
    }
}

// Appends the tensors of layer i of the part sh, on the blocks' local config `local`, bound to
// lw when given (its hosted experts one spec each), else unbound with `hosted` experts stacked.
void add_layer(TensorList& list,
               const ModelConfig& cfg,
               const ModelConfig& local,
               const ModelShard& sh,
               int i,
               LayerWeights* lw,
               const std::vector<int>& hosted) {
    const int64_t d = cfg.hidden_size;
    const LayerSpec& spec = cfg.layers[i];
    const std::string p = layer_prefix(i);
    list.push_back(
        {p + "input_layernorm.weight", {d}, slot(lw, &LayerWeights::attn_norm), Init::ones});
    if (spec.mixer == Mixer::kda)
        append(list, kda_tensors(local, lw ? &lw->kda : nullptr), p + "self_attn.");
    else
        append(list, attention_tensors(local, spec, lw ? &lw->attn : nullptr), p + "self_attn.");
    list.push_back({p + "post_attention_layernorm.weight",
                    {d},
                    slot(lw, &LayerWeights::ffn_norm),
                    Init::ones});
    const bool dense = spec.ffn == Ffn::dense;
    const std::vector<int> placed =
        lw ? hosted_experts(local, sh, lw->moe.expert_rank) : std::vector<int>{};
    append(list,
           ffn_tensors(local,
                       spec,
                       lw && dense ? &lw->dense : nullptr,
                       lw && !dense ? &lw->moe : nullptr,
                       lw ? &placed : &hosted),
           ffn_prefix(cfg, i));
}

// The tensors of the part sh of cfg, on the blocks' local config `local`, bound to m's buffers
// when m is given, else unbound (weight_list).
TensorList describe(const ModelConfig& cfg,
                    const ModelConfig& local,
                    const ModelShard& sh,
                    Model* m) {
    const int64_t d = cfg.hidden_size, v_part = cfg.vocab_size / sh.tp;
    auto named = [](WeightBlock block, TensorSpec t) {
        t.block = block;
        return t;
    };
    TensorList list;
    list.reserve(static_cast<size_t>(sh.end_layer - sh.first_layer) * 32 + 4);
    if (sh.first_stage() || (sh.last_stage() && cfg.tie_word_embeddings))
        list.push_back(
            named(sh.first_stage() ? WeightBlock::embedding : WeightBlock::head,
                  split(0, {"model.embed_tokens.weight", {v_part, d}, m ? &m->embed : nullptr})));
    const std::vector<int> contiguous =
        sh.end_layer > sh.first_layer ? hosted_experts(local, sh, {}) : std::vector<int>{};
    for (int i = sh.first_layer; i < sh.end_layer; ++i)
        add_layer(list, cfg, local, sh, i, m ? &m->layers[i] : nullptr, contiguous);
    if (sh.first_stage() && cfg.vision.present)  // replicated: every tp rank holds it whole
        append(list, vision_tensors(local, m ? &m->vision : nullptr), "");
    if (sh.last_stage()) {
        list.push_back({"model.norm.weight", {d}, m ? &m->final_norm : nullptr, Init::ones});
        if (!cfg.tie_word_embeddings)
            list.push_back(
                named(WeightBlock::head,
                      split(0, {"lm_head.weight", {v_part, d}, m ? &m->lm_head : nullptr})));
    }
    return list;
}

}  // namespace

TensorList weight_list(const ModelConfig& cfg, const ModelShard& sh) {
    return describe(cfg, local_config(cfg, sh), sh, nullptr);
}

TensorList layer_weight_list(const ModelConfig& cfg, const ModelShard& sh, int layer) {
    const ModelConfig local = local_config(cfg, sh);
    TensorList list;
    add_layer(list, cfg, local, sh, layer, nullptr, hosted_experts(local, sh, {}));
    return list;
}

TensorList model_tensors(Model& m) {
    return with_storage(describe(m.cfg, m.local, m.shard, &m), m.weight_dtype);
}

TensorList model_tensors(const Model& m) {
    return model_tensors(const_cast<Model&>(m));  // binds addresses only; writes nothing
}

TensorList expert_tensors(Model& m, int layer, const std::vector<int>& experts) {
    TensorList list;
    append(list,
           routed_expert_tensors(m.local, m.local.layers[layer], m.layers[layer].moe, experts),
           ffn_prefix(m.local, layer));
    return with_storage(std::move(list), m.weight_dtype);
}

ParamCount count_params(const ModelConfig& cfg) {
    ParamCount pc;
    int64_t routed = 0, routed_active = 0;  // every routed expert; top_k of each MoE layer's
    for (const TensorSpec& t : weight_list(cfg, whole_model(cfg))) {
        const int64_t n = t.numel();
        pc.total += n;
        if (t.block == WeightBlock::embedding || t.block == WeightBlock::head)
            pc.embedding += n;
        if (t.block == WeightBlock::vision)
            pc.vision += n;
        if (t.block == WeightBlock::routed_experts) {
            routed += n;
            routed_active += cfg.moe.top_k * shape_numel(t.shape);
        }
    }
    pc.active = pc.total - pc.vision - routed + routed_active;
    return pc;
}

}  // namespace hymoe::model
