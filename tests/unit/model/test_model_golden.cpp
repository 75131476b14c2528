// Whole-model goldens (spec/model-math.md §13: the 4-layer tiny model of each family) against the
// torch fp32 reference of tests/golden/gen_model.py: tiny (KKKG / -EEE), tiny-kimi (KKKM, NoPE
// MLA, Kimi MoE names) and tiny-deepseek (DDDD with YaRN, grouped routing). Each preset's model is
// loaded by HF name from tests/golden/model_<preset>.h5 (every name model_tensors() lists, no
// other, shapes checked) and runs two packed sequences (13 + 24 tokens): the prefill must match
// the golden logits to 1e-5 and the same tokens decoded one step at a time (the two sequences in
// one batch while both last) to 1e-4, errors absolute up to |logit| = 1 and relative above. The
// config fields the generator used must equal preset_config(<preset>). Run from the repository
// root (the golden files are read by relative path).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "hymoe/io/h5.h"
#include "hymoe/model/config.h"
#include "hymoe/model/model.h"

namespace {

using namespace hymoe;
using namespace hymoe::model;

// The ModelConfig fields gen_model.py writes out ("config.keys" / "config.values"), read from a
// config: the sections of the blocks the model uses; bools and enums as 0/1, no lower bound as 0.
std::map<std::string, double> used_fields(const ModelConfig& c) {
    auto num = [](auto v) { return static_cast<double>(v); };
    std::map<std::string, double> f = {
        {"vocab_size", num(c.vocab_size)},
        {"hidden_size", num(c.hidden_size)},
        {"intermediate_size", num(c.intermediate_size)},
        {"rms_norm_eps", c.rms_norm_eps},
        {"tie_word_embeddings", num(c.tie_word_embeddings)},
    };
    if (count_layers(c, Mixer::kda) > 0) {
        f["kda.n_head"] = num(c.kda.n_head);
        f["kda.head_dim"] = num(c.kda.head_dim);
        f["kda.conv_kernel"] = num(c.kda.conv_kernel);
        f["kda.gate_lower_bound"] = c.kda.gate_lower_bound.value_or(0.0);
    }
    if (count_layers(c, Mixer::mla) + count_layers(c, Mixer::dsa) > 0) {
        const MlaConfig& m = c.mla;
        f["mla.n_head"] = num(m.n_head);
        f["mla.q_lora_rank"] = num(m.q_lora_rank);
        f["mla.kv_lora_rank"] = num(m.kv_lora_rank);
        f["mla.qk_nope_head_dim"] = num(m.qk_nope_head_dim);
        f["mla.qk_rope_head_dim"] = num(m.qk_rope_head_dim);
        f["mla.v_head_dim"] = num(m.v_head_dim);
        f["mla.nope"] = num(m.nope);
        f["mla.rope_theta"] = m.rope_theta;
        f["mla.rope_yarn"] = num(m.rope_scaling == RopeScaling::yarn);
        f["mla.softmax_scale_yarn"] = num(m.softmax_scale == SoftmaxScale::yarn);
        f["mla.norm_eps"] = m.norm_eps;
        if (m.rope_scaling == RopeScaling::yarn) {
            f["mla.yarn_factor"] = m.yarn_factor;
            f["mla.yarn_original_max_position"] = num(m.yarn_original_max_position);
            f["mla.yarn_beta_fast"] = m.yarn_beta_fast;
            f["mla.yarn_beta_slow"] = m.yarn_beta_slow;
            f["mla.yarn_mscale"] = m.yarn_mscale;
            f["mla.yarn_mscale_all_dim"] = m.yarn_mscale_all_dim;
        }
    }
    if (count_layers(c, Mixer::dsa) > 0) {
        f["indexer.n_head"] = num(c.indexer.n_head);
        f["indexer.head_dim"] = num(c.indexer.head_dim);
        f["indexer.top_k"] = num(c.indexer.top_k);
    }
    if (count_layers(c, Ffn::moe) > 0) {
        const MoeConfig& m = c.moe;
        f["moe.n_routed_experts"] = num(m.n_routed_experts);
        f["moe.top_k"] = num(m.top_k);
        f["moe.n_shared_experts"] = num(m.n_shared_experts);
        f["moe.moe_intermediate"] = num(m.moe_intermediate);
        f["moe.shared_intermediate"] = num(m.shared_intermediate);
        f["moe.n_group"] = num(m.n_group);
        f["moe.topk_group"] = num(m.topk_group);
        f["moe.scoring_sigmoid"] = num(m.scoring == Scoring::sigmoid);
        f["moe.renormalize"] = num(m.renormalize);
        f["moe.routed_scaling_factor"] = m.routed_scaling_factor;
        f["moe.correction_bias"] = num(m.correction_bias);
        f["moe.weights_from_biased_scores"] = num(m.weights_from_biased_scores);
        f["moe.capacity_factor"] = m.capacity_factor;
        f["moe.expert_act_swiglu"] = num(m.expert_act == ExpertAct::swiglu);
    }
    return f;
}

// max_i |a_i − ref_i| / max(1, |ref_i|): absolute for small logits, relative for large ones.
float max_err(const std::vector<float>& a, const std::vector<float>& ref) {
    BOOST_REQUIRE_EQUAL(a.size(), ref.size());
    float e = 0.0f;
    for (size_t i = 0; i < a.size(); ++i)
        e = std::max(e, std::abs(a[i] - ref[i]) / std::max(1.0f, std::abs(ref[i])));
    return e;
}

std::vector<float> values(const Buffer& b) {
    return std::vector<float>(b.ptr<float>(), b.ptr<float>() + b.view().numel());
}

void check_golden(const std::string& preset) {
    const std::string path = "tests/golden/model_" + preset + ".h5";
    BOOST_REQUIRE_MESSAGE(std::filesystem::exists(path),
                          path << " is missing (run the tests from the repository root)");
    const io::H5Reader h5(path);
    const ModelConfig cfg = preset_config(preset);

    // the generator's config is the preset's
    BOOST_TEST(h5.text("config.model_type") == cfg.model_type);
    BOOST_TEST(h5.text("config.layer_pattern") == layer_pattern(cfg));
    BOOST_TEST(h5.text("config.ffn_pattern") == ffn_pattern(cfg));
    const std::vector<std::string> keys = h5.strings("config.keys");
    const std::vector<float> vals = h5.floats("config.values");
    BOOST_REQUIRE_EQUAL(keys.size(), vals.size());
    std::map<std::string, double> expected = used_fields(cfg);
    for (size_t i = 0; i < keys.size(); ++i) {
        BOOST_TEST_CONTEXT("config field " << keys[i]) {
            BOOST_REQUIRE(expected.count(keys[i]) == 1);
            BOOST_TEST(vals[i] == static_cast<float>(expected[keys[i]]));
            expected.erase(keys[i]);
        }
    }
    for (const auto& [key, value] : expected)
        BOOST_ERROR("config field " << key << " = " << value << " missing from " << path);

    // weights: exactly the names model_tensors() lists, with their shapes (the language model:
    // the vision tower has its own golden, tests/golden/vision.h5)
    ModelConfig text = cfg;
    text.vision.present = false;
    Model m = make_model(text);
    std::set<std::string> names;
    for (const TensorSpec& s : model_tensors(m))
        names.insert(s.name);
    const std::vector<std::string> stored = h5.strings("weight_names");
    BOOST_TEST((std::set<std::string>(stored.begin(), stored.end()) == names));
    BOOST_TEST(stored.size() == names.size());
    load_model_weights(m, [&](const std::string& name, const TensorPart&, Tensor& dest) {
        BOOST_REQUIRE_MESSAGE(h5.exists(name), name << " missing from " << path);
        BOOST_REQUIRE_MESSAGE(h5.shape(name) == dest.shape,
                              name << ": " << shape_string(h5.shape(name)) << " in the file, "
                                   << shape_string(dest.shape) << " in the model");
        const std::vector<float> v = h5.floats(name);
        std::copy(v.begin(), v.end(), dest.ptr<float>());
    });

    const std::vector<int64_t> tokens = h5.ints("tokens");
    const std::vector<int64_t> offsets = h5.ints("offsets");
    const int64_t n_seq = static_cast<int64_t>(offsets.size()) - 1, n_tok = offsets.back();
    const int64_t V = cfg.vocab_size;
    BOOST_REQUIRE_EQUAL(static_cast<int64_t>(tokens.size()), n_tok);
    BOOST_REQUIRE((h5.shape("logits") == Shape{n_tok, V}));
    const std::vector<float> ref = h5.floats("logits");

    // prefill: both sequences packed in one call
    std::vector<SequenceState> states;
    std::vector<SequenceState*> ptrs;
    for (int64_t s = 0; s < n_seq; ++s)
        states.push_back(make_sequence_state(m));
    for (SequenceState& st : states)
        ptrs.push_back(&st);
    Buffer logits;
    forward(m, tokens, SeqBatch{offsets, std::vector<int64_t>(n_seq, 0), {}}, ptrs, logits);
    BOOST_REQUIRE((logits.view().shape == Shape{n_tok, V}));
    const float prefill_err = max_err(values(logits), ref);
    BOOST_TEST(prefill_err <= 1e-5f);

    // decode: one token per live sequence per call, from fresh states
    std::vector<float> decoded(ref.size());
    for (SequenceState& st : states)
        st = make_sequence_state(m);
    for (int64_t t = 0;; ++t) {
        SeqBatch step{{0}, {}, {}};
        std::vector<int64_t> step_tokens, rows;
        std::vector<SequenceState*> step_states;
        for (int64_t s = 0; s < n_seq; ++s) {
            if (offsets[s] + t >= offsets[s + 1])
                continue;
            rows.push_back(offsets[s] + t);
            step_tokens.push_back(tokens[offsets[s] + t]);
            step_states.push_back(&states[s]);
            step.offsets.push_back(step.offsets.back() + 1);
            step.pos0.push_back(t);
        }
        if (rows.empty())
            break;
        forward(m, step_tokens, step, step_states, logits);
        for (size_t i = 0; i < rows.size(); ++i)
            std::copy_n(logits.ptr<float>() + static_cast<int64_t>(i) * V,
                        V,
                        decoded.begin() + rows[i] * V);
    }
    const float decode_err = max_err(decoded, ref);
    BOOST_TEST(decode_err <= 1e-4f);
    BOOST_TEST_MESSAGE("model golden " << preset << ": prefill max error " << prefill_err
                                       << ", decode max error " << decode_err);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(model_golden)

BOOST_AUTO_TEST_CASE(tiny) {
    check_golden("tiny");
}

BOOST_AUTO_TEST_CASE(tiny_kimi) {
    check_golden("tiny-kimi");
}

BOOST_AUTO_TEST_CASE(tiny_deepseek) {
    check_golden("tiny-deepseek");
}

BOOST_AUTO_TEST_SUITE_END()
