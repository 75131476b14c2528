// Unit tests of the model's views (hymoe/model/model_views.h) on the CPU: for every kind of layer
// (kda, mla, gated mla, dsa, gated dsa; dense, moe, latent_moe; with and without a query latent,
// swiglu and relu2 experts, tied and untied heads, a pp stage with an ep placement) every view
// is the Buffer the weight list names, at the list's shape, field by field as the blocks' own
// view functions give it, and nothing else is viewed; a missing, unloaded or mis-shaped tensor
// fails naming it. The stacks a device walk puts the routed experts into are the unbound list's
// stacked tensors.
#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include "hymoe/core/error.h"
#include "hymoe/model/model.h"
#include "hymoe/model/model_views.h"
#include "hymoe/model/tensor_list.h"

namespace data = boost::unit_test::data;
using namespace hymoe;
using namespace hymoe::model;

namespace {

using Labeled = std::vector<std::pair<std::string, Tensor>>;

void add(Labeled& out, const std::string& label, const Tensor& t) {
    out.emplace_back(label, t);
}

void add_mlp(Labeled& out, const std::string& p, const DenseFfnViews& v) {
    add(out, p + "gate", v.gate_proj);
    add(out, p + "up", v.up_proj);
    add(out, p + "down", v.down_proj);
}

// Every tensor of a layer's views, labelled by field.
Labeled fields(const LayerViews& l) {
    Labeled out;
    add(out, "attn_norm", l.attn_norm);
    add(out, "ffn_norm", l.ffn_norm);
    const KdaWeightViews& k = l.kda;
    for (const auto& [n, t] : Labeled{{"q_proj", k.q_proj},
                                      {"k_proj", k.k_proj},
                                      {"v_proj", k.v_proj},
                                      {"q_conv1d", k.q_conv1d},
                                      {"k_conv1d", k.k_conv1d},
                                      {"v_conv1d", k.v_conv1d},
                                      {"f_a_proj", k.f_a_proj},
                                      {"f_b_proj", k.f_b_proj},
                                      {"dt_bias", k.dt_bias},
                                      {"a_log", k.a_log},
                                      {"b_proj", k.b_proj},
                                      {"g_a_proj", k.g_a_proj},
                                      {"g_b_proj", k.g_b_proj},
                                      {"o_norm", k.o_norm},
                                      {"o_proj", k.o_proj}})
        add(out, "kda." + n, t);
    const MlaWeightViews& a = l.mla;
    for (const auto& [n, t] : Labeled{{"q_a_proj", a.q_a_proj},
                                      {"q_a_layernorm", a.q_a_layernorm},
                                      {"q_b_proj", a.q_b_proj},
                                      {"q_proj", a.q_proj},
                                      {"kv_a_proj_with_mqa", a.kv_a_proj_with_mqa},
                                      {"kv_a_layernorm", a.kv_a_layernorm},
                                      {"kv_b_proj", a.kv_b_proj},
                                      {"o_proj", a.o_proj},
                                      {"g_proj", a.g_proj},
                                      {"indexer.wq_b", a.indexer.wq_b},
                                      {"indexer.wk", a.indexer.wk},
                                      {"indexer.k_norm_weight", a.indexer.k_norm_weight},
                                      {"indexer.k_norm_bias", a.indexer.k_norm_bias},
                                      {"indexer.weights_proj", a.indexer.weights_proj}})
        add(out, "mla." + n, t);
    add_mlp(out, "dense.", l.dense);
    const MoeWeightViews& m = l.moe;
    add(out, "moe.router", m.router);
    add(out, "moe.bias", m.bias);
    add(out, "moe.fc1", m.fc1);
    add(out, "moe.fc2", m.fc2);
    for (size_t e = 0; e < m.experts.up.size(); ++e) {
        const std::string p = "moe.experts." + std::to_string(e) + ".";
        add(out, p + "gate", m.experts.gate.at(e));
        add(out, p + "up", m.experts.up.at(e));
        add(out, p + "down", m.experts.down.at(e));
    }
    add_mlp(out, "moe.shared.", m.shared);
    return out;
}

// The same fields straight from the host structs by the blocks' view functions: the reference
// for which Buffer each field views.
LayerViews direct(const LayerSpec& spec, const LayerWeights& w) {
    LayerViews v;
    v.attn_norm = w.attn_norm.view();
    v.ffn_norm = w.ffn_norm.view();
    if (spec.mixer == Mixer::kda)
        v.kda = kda_views(w.kda);
    else
        v.mla = attention_views(w.attn);
    if (spec.ffn == Ffn::dense) {
        v.dense = ffn_views(w.dense);
    } else {
        v.moe = moe_views(w.moe);
    }
    return v;
}

// Checks the views of m against its weight list and its host structs.
void check_views(const Model& m, const ModelViews& v) {
    std::map<const void*, Shape> listed;  // every listed non-vision buffer: data → list shape
    for (const TensorSpec& s : model_tensors(m))
        if (s.block != WeightBlock::vision) {
            BOOST_TEST_REQUIRE(s.dest->view().data != nullptr);
            listed.emplace(s.dest->view().data, s.shape);
        }
    std::map<const void*, int> viewed;
    auto seen = [&](const std::string& label, const Tensor& t) {
        if (t.data == nullptr)
            return;
        const auto it = listed.find(t.data);
        BOOST_TEST_INFO(label);
        BOOST_TEST_REQUIRE((it != listed.end()));
        BOOST_TEST_INFO(label);
        BOOST_TEST((t.shape == it->second));
        ++viewed[t.data];
    };
    BOOST_TEST_REQUIRE(v.layers.size() == m.layers.size());
    for (int i = 0; i < static_cast<int>(m.layers.size()); ++i) {
        const Labeled got = fields(v.layers[i]);
        if (!m.shard.owns_layer(i)) {
            for (const auto& [label, t] : got)
                BOOST_TEST((t.data == nullptr));
            continue;
        }
        const Labeled want = fields(direct(m.cfg.layers[i], m.layers[i]));
        BOOST_TEST_REQUIRE(got.size() == want.size());
        for (size_t f = 0; f < got.size(); ++f) {
            const std::string label = "layer " + std::to_string(i) + " " + got[f].first;
            BOOST_TEST_INFO(label);
            BOOST_TEST((got[f].second.data == want[f].second.data));
            BOOST_TEST_INFO(label);
            BOOST_TEST((got[f].second.shape == want[f].second.shape));
            seen(label, got[f].second);
        }
        const LayerViews& l = v.layers[i];
        if (m.cfg.layers[i].mixer == Mixer::kda)
            BOOST_TEST((l.kda.lora == &m.layers[i].kda.lora));
        else
            BOOST_TEST((l.mla.lora == &m.layers[i].attn.lora));
    }
    if (m.shard.first_stage())
        BOOST_TEST((v.embed.data == m.embed.view().data));
    if (m.shard.last_stage()) {
        BOOST_TEST((v.final_norm.data == m.final_norm.view().data));
        BOOST_TEST((v.head.data == m.head().view().data));
    } else {
        BOOST_TEST((v.final_norm.data == nullptr && v.head.data == nullptr));
    }
    seen("embed", v.embed);
    seen("final_norm", v.final_norm);
    if (!m.cfg.tie_word_embeddings)
        seen("head", v.head);
    BOOST_TEST(viewed.size() == listed.size());  // every listed tensor viewed ...
    for (const auto& [data, n] : viewed)
        BOOST_TEST(n == 1);  // ... once
}

struct Case {
    std::string name;
    std::string preset;
    std::vector<LayerSpec> layers;  // empty: the preset's
    int q_lora_rank = -1;           // −1: the preset's
    bool relu2 = false;
    bool tied = false;
};

std::ostream& operator<<(std::ostream& os, const Case& c) {
    return os << c.name;
}

const LayerSpec kda_dense{Mixer::kda, false, Ffn::dense};
const LayerSpec mla_moe{Mixer::mla, false, Ffn::moe};
const LayerSpec gated_mla_latent{Mixer::mla, true, Ffn::latent_moe};
const LayerSpec dsa_moe{Mixer::dsa, false, Ffn::moe};
const LayerSpec gated_dsa_latent{Mixer::dsa, true, Ffn::latent_moe};
const LayerSpec kda_latent{Mixer::kda, false, Ffn::latent_moe};

const std::vector<Case> kCases = {
    {"tiny", "tiny", {}, -1, false, false},
    {"tiny-kimi", "tiny-kimi", {}, -1, false, false},
    {"tiny-deepseek", "tiny-deepseek", {}, -1, false, false},
    {"every kind, q latent",
     "tiny",
     {kda_dense, mla_moe, gated_mla_latent, dsa_moe, gated_dsa_latent, kda_latent},
     -1,
     false,
     false},
    {"mla without q latent, relu2, tied",
     "tiny",
     {kda_dense, mla_moe, gated_mla_latent, kda_latent},
     0,
     true,
     true},
};

ModelConfig config_of(const Case& c) {
    ModelConfig cfg = preset_config(c.preset);
    if (!c.layers.empty())
        cfg.layers = c.layers;
    if (c.q_lora_rank >= 0)
        cfg.mla.q_lora_rank = c.q_lora_rank;
    if (c.relu2)
        cfg.moe.expert_act = ExpertAct::relu2;
    cfg.tie_word_embeddings = c.tied;
    return cfg;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(model_view_builder)

BOOST_DATA_TEST_CASE(every_view_is_the_listed_buffer, data::make(kCases), c) {
    Model m = make_model(config_of(c));
    init_model_random(m, 3);
    check_views(m, host_views(m));
}

// The last of two pp stages, rank 1 of ep = 2 under a placement that is not the contiguous one:
// the stage's layers alone, their hosted experts alone.
BOOST_AUTO_TEST_CASE(a_stage_with_placed_experts) {
    const ModelConfig cfg = preset_config("tiny");  // 8 experts, layers 1-3 MoE
    Model m = make_model(cfg);
    m.shard.pp = 2;
    m.shard.stage = 1;
    m.shard.first_layer = 2;
    m.shard.end_layer = 4;
    m.shard.ep = 2;
    m.shard.ep_rank = 1;
    m.local = local_config(cfg, m.shard);
    for (int i = 2; i < 4; ++i)
        m.layers[i].moe.expert_rank = {0, 1, 1, 0, 1, 0, 0, 1};
    init_model_random(m, 3);
    const ModelViews v = host_views(m);
    check_views(m, v);
    const MoeWeightViews& moe = v.layers[3].moe;
    for (int e = 0; e < 8; ++e)
        BOOST_TEST((moe.experts.up[e].data != nullptr) == (m.layers[3].moe.expert_rank[e] == 1));
    BOOST_TEST((v.embed.data == nullptr));
}

// A missing, unloaded or mis-shaped tensor fails with its name (and both shapes).
BOOST_AUTO_TEST_CASE(a_bad_tensor_is_named) {
    Model m = make_model(preset_config("tiny"));
    init_model_random(m, 3);
    const std::string name = "model.layers.3.self_attn.indexer.wk.weight";
    auto fails_with = [&](const NamedTensors& t, const std::vector<std::string>& words) {
        try {
            model_views(m, t);
            BOOST_ERROR("no error");
        } catch (const Error& e) {
            BOOST_TEST((e.code() == Exit::internal));
            for (const std::string& w : words) {
                BOOST_TEST_INFO(e.what());
                BOOST_TEST(std::string(e.what()).find(w) != std::string::npos);
            }
        }
    };
    NamedTensors missing = named_views(m);
    BOOST_TEST_REQUIRE(missing.erase(name) == 1u);
    fails_with(missing, {name, "no tensor"});
    NamedTensors unloaded = named_views(m);
    unloaded.at(name).data = nullptr;
    fails_with(unloaded, {name, "not loaded"});
    NamedTensors reshaped = named_views(m);
    Tensor& t = reshaped.at(name);
    t.shape = {t.shape[1], t.shape[0]};
    fails_with(reshaped, {name, "[64, 16]", "[16, 64]"});
    BOOST_CHECK_NO_THROW(model_views(m, named_views(m)));
}

// Each routed expert's matrix of a bound list goes into a stack the unbound list names, of as
// many experts as its count, at its own slot, in id order; nothing else is stacked.
BOOST_AUTO_TEST_CASE(expert_stacks_are_the_unbound_lists_stacks) {
    for (int ep_rank : {0, 1}) {
        const ModelConfig cfg = preset_config("tiny-kimi");  // 8 experts; layers 1-3 MoE
        Model m = make_model(cfg);
        m.shard.ep = 2;
        m.shard.ep_rank = ep_rank;
        for (int i = 1; i < 4; ++i)
            m.layers[i].moe.expert_rank = {1, 0, 0, 1, 1, 0, 1, 0};
        init_model_random(m, 3);
        const TensorList list = model_tensors(m);
        const std::vector<StackSlot> slots = expert_stacks(list);
        BOOST_TEST_REQUIRE(slots.size() == list.size());
        const TensorList whole = weight_list(cfg, m.shard);
        std::map<std::string, std::vector<int64_t>> seen;  // each stack's slots in list order
        int64_t n_stacked = 0;
        for (size_t i = 0; i < list.size(); ++i) {
            const StackSlot& s = slots[i];
            BOOST_TEST(s.stack.empty() == (list[i].block != WeightBlock::routed_experts));
            if (s.stack.empty()) {
                BOOST_TEST(s.size == 1);
                continue;
            }
            ++n_stacked;
            const auto it = std::find_if(
                whole.begin(), whole.end(), [&](const TensorSpec& u) { return u.name == s.stack; });
            BOOST_TEST_INFO(s.stack);
            BOOST_TEST_REQUIRE((it != whole.end()));
            BOOST_TEST(it->count == s.size);
            BOOST_TEST((it->shape == list[i].shape));
            seen[s.stack].push_back(s.slot);
        }
        BOOST_TEST(n_stacked == 3 * 4 * 3);  // 3 layers, 4 hosted experts, 3 matrices
        BOOST_TEST(seen.size() == 9u);
        for (const auto& [name, got] : seen)
            BOOST_TEST(got == (std::vector<int64_t>{0, 1, 2, 3}), boost::test_tools::per_element());
        // slot order is id order: layer 2's w1 of the first hosted expert is slot 0
        const std::string first = ep_rank == 0 ? "1" : "0";
        const auto it = std::find_if(list.begin(), list.end(), [&](const TensorSpec& t) {
            return t.name == "model.layers.2.block_sparse_moe.experts." + first + ".w1.weight";
        });
        BOOST_TEST_REQUIRE((it != list.end()));
        BOOST_TEST(slots[static_cast<size_t>(it - list.begin())].slot == 0);
    }
}

BOOST_AUTO_TEST_SUITE_END()
