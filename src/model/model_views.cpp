// The one builder of the model's views (hymoe/model/model_views.h): the weight list bound to an
// empty model of m's shape, each of its buffers set to view the tensor of its name (checked
// against the list's shape), then the blocks' own view functions on that model's structs; and
// the stacking of the routed experts a device walk of the list does (expert_stacks).
#include "hymoe/model/model_views.h"

#include "hymoe/core/error.h"
#include "hymoe/model/model.h"
#include "hymoe/model/tensor_list.h"

namespace hymoe::model {

namespace {

// A model with m's config, part and expert placement and no weights.
Model shape_of(const Model& m) {
    Model s;
    s.cfg = m.cfg;
    s.shard = m.shard;
    s.local = m.local;
    s.weight_dtype = m.weight_dtype;
    s.layers.resize(m.layers.size());
    for (size_t i = 0; i < m.layers.size(); ++i)
        s.layers[i].moe.expert_rank = m.layers[i].moe.expert_rank;
    return s;
}

// The name of the stack a routed expert's matrix goes into: its name with the expert's id as "*".
std::string stack_name(const std::string& name) {
    const std::string experts = ".experts.";
    const size_t at = name.find(experts);
    HYMOE_CHECK(at != std::string::npos, "a routed expert's weight named ", name);
    const size_t id = at + experts.size(), dot = name.find('.', id);
    HYMOE_CHECK(dot != std::string::npos, "a routed expert's weight named ", name);
    return name.substr(0, id) + "*" + name.substr(dot);
}

// The tensor named by spec, checked against its shape.
Tensor looked_up(const NamedTensors& tensors, const TensorSpec& spec) {
    const auto it = tensors.find(spec.name);
    if (it == tensors.end())
        HYMOE_FAIL_ONE(
            Exit::internal, "model views: no tensor ", spec.name, " (the weight list names it)");
    const Tensor& t = it->second;
    if (t.data == nullptr)
        HYMOE_FAIL_ONE(Exit::internal, "model views: ", spec.name, " holds no data (not loaded)");
    if (t.shape != spec.shape)
        HYMOE_FAIL_ONE(Exit::internal,
                       "model views: ",
                       spec.name,
                       " is ",
                       shape_string(t.shape),
                       " where the weight list gives ",
                       shape_string(spec.shape));
    return t;
}

// Layer w's views by its spec, host adapters null.
LayerViews layer_views(const LayerSpec& spec, const LayerWeights& w) {
    LayerViews v;
    v.attn_norm = w.attn_norm.view();
    v.ffn_norm = w.ffn_norm.view();
    if (spec.mixer == Mixer::kda) {
        v.kda = kda_views(w.kda);
        v.kda.lora = nullptr;
    } else {
        v.mla = attention_views(w.attn);
        v.mla.lora = nullptr;
    }
    if (spec.ffn == Ffn::dense) {
        v.dense = ffn_views(w.dense);
        v.dense.lora = nullptr;
    } else {
        v.moe = moe_views(w.moe);
        v.moe.host_bias = Tensor{};
        v.moe.experts.lora.clear();
        v.moe.shared.lora = nullptr;
    }
    return v;
}

}  // namespace

std::vector<StackSlot> expert_stacks(const TensorList& list) {
    std::vector<StackSlot> out(list.size());
    std::unordered_map<std::string, int64_t> filled;  // each stack's slots given so far
    for (size_t i = 0; i < list.size(); ++i)
        if (list[i].block == WeightBlock::routed_experts) {
            out[i].stack = stack_name(list[i].name);
            out[i].slot = filled[out[i].stack]++;
        }
    for (StackSlot& s : out)
        if (!s.stack.empty())
            s.size = filled[s.stack];
    return out;
}

ModelViews model_views(const Model& m, const NamedTensors& tensors) {
    Model s = shape_of(m);
    for (const TensorSpec& spec : model_tensors(s))
        if (spec.block != WeightBlock::vision)
            spec.dest->view() = looked_up(tensors, spec);
    ModelViews v;
    v.embed = s.embed.view();
    v.final_norm = s.final_norm.view();
    if (s.shard.last_stage())
        v.head = s.head().view();
    v.layers.resize(s.layers.size());
    for (int i = s.shard.first_layer; i < s.shard.end_layer; ++i)
        v.layers[i] = layer_views(s.cfg.layers[i], s.layers[i]);
    return v;
}

NamedTensors named_views(const Model& m) {
    NamedTensors out;
    for (const TensorSpec& spec : model_tensors(m))
        out.emplace(spec.name, spec.dest->view());
    return out;
}

void add_routing_host_side(ModelViews& v, const Model& m) {
    for (int i = m.shard.first_layer; i < m.shard.end_layer; ++i)
        if (m.cfg.layers[i].ffn != Ffn::dense) {
            v.layers[i].moe.host_bias = m.layers[i].moe.correction_bias.view();
            v.layers[i].moe.expert_rank = m.layers[i].moe.expert_rank;
        }
}

ModelViews host_views(const Model& m) {
    ModelViews v = model_views(m, named_views(m));
    for (int i = m.shard.first_layer; i < m.shard.end_layer; ++i) {
        const LayerWeights& w = m.layers[i];
        LayerViews& l = v.layers[i];
        if (m.cfg.layers[i].mixer == Mixer::kda)
            l.kda.lora = &w.kda.lora;
        else
            l.mla.lora = &w.attn.lora;
        if (m.cfg.layers[i].ffn == Ffn::dense)
            l.dense.lora = &w.dense.lora;
        else
            l.moe = moe_views(w.moe);  // with the host bias and every host adapter
    }
    return v;
}

}  // namespace hymoe::model
