// Unit tests of the model configuration layer (hymoe/model/config.h): the shipped HF configs load
// with the layer layouts of spec/model-math.md §2, parameter counts land on the published totals,
// inputs/models/tiny/config.json equals the tiny preset, every preset survives the native format,
// and malformed configs fail with Exit::invalid in one sentence naming the file and the key.
// Run from the repository root (the shipped configs are read by relative path).
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <stdlib.h>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>
#include <nlohmann/json.hpp>

#include "hymoe/core/error.h"
#include "hymoe/model/config.h"

namespace {

using namespace hymoe::model;
using Json = nlohmann::json;

const std::string kimi_path = "inputs/models/kimi-linear-48b-a3b/config.json";
const std::string deepseek_path = "inputs/models/deepseek-v3.2/config.json";
const std::string tiny_path = "inputs/models/tiny/config.json";

Json read_json(const std::string& path) {
    std::ifstream in(path);
    BOOST_REQUIRE_MESSAGE(in, path << " is missing (run the tests from the repository root)");
    return Json::parse(in);
}

// A fresh directory under $TMPDIR, removed with everything in it.
struct TempDir {
    std::filesystem::path path;
    TempDir() {
        std::string name =
            (std::filesystem::temp_directory_path() / "hymoe_config_XXXXXX").string();
        BOOST_REQUIRE(mkdtemp(name.data()) != nullptr);
        path = name;
    }
    ~TempDir() {
        std::error_code ec;
        std::filesystem::remove_all(path, ec);
    }
    std::string write(const std::string& name, const std::string& text) const {
        std::string p = (path / name).string();
        std::ofstream(p) << text;
        return p;
    }
};

// f() must throw hymoe::Error(Exit::invalid) with a one-line message containing every part.
void expect_invalid(const std::function<void()>& f, const std::vector<std::string>& parts) {
    try {
        f();
        BOOST_ERROR("no error; expected one naming " << parts.front());
    } catch (const hymoe::Error& e) {
        std::string msg = e.what();
        BOOST_CHECK_MESSAGE(e.code() == hymoe::Exit::invalid, "exit code of: " << msg);
        BOOST_CHECK_MESSAGE(msg.find('\n') == std::string::npos, "one line: " << msg);
        for (const std::string& p : parts)
            BOOST_CHECK_MESSAGE(msg.find(p) != std::string::npos,
                                "message \"" << msg << "\" should contain \"" << p << "\"");
    }
}

double rel_diff(double x, double ref) {
    return std::fabs(x - ref) / ref;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(model_config)

BOOST_AUTO_TEST_CASE(kimi_linear_layout) {
    ModelConfig c = load_model_config(kimi_path);
    BOOST_TEST(c.model_type == "kimi_linear");
    BOOST_REQUIRE_EQUAL(c.layers.size(), 27u);
    // full_attn_layers [4,8,...,24,27] are 1-based: 0-based MLA layers {3,7,11,15,19,23,26}.
    const std::set<int> mla = {3, 7, 11, 15, 19, 23, 26};
    for (int i = 0; i < 27; ++i) {
        BOOST_TEST_CONTEXT("layer " << i) {
            BOOST_TEST((c.layers[i].mixer == (mla.count(i) ? Mixer::mla : Mixer::kda)));
            BOOST_TEST(!c.layers[i].gated);
            BOOST_TEST((c.layers[i].ffn == (i == 0 ? Ffn::dense : Ffn::moe)));
        }
    }
    BOOST_TEST(layer_pattern(c) == "KKKM KKKM KKKM KKKM KKKM KKKM KKM");
    BOOST_TEST(c.hidden_size == 2304);
    BOOST_TEST(c.intermediate_size == 9216);
    BOOST_TEST(c.max_position == 1048576);
    BOOST_TEST(c.kda.n_head == 32);
    BOOST_TEST(c.kda.head_dim == 128);
    BOOST_TEST(c.kda.conv_kernel == 4);
    BOOST_TEST(!c.kda.gate_lower_bound.has_value());
    BOOST_TEST(c.mla.q_lora_rank == 0);  // q_lora_rank: null
    BOOST_TEST(c.mla.kv_lora_rank == 512);
    BOOST_TEST(c.mla.nope);
    BOOST_TEST(mla_softmax_scale(c.mla) == 1.0 / std::sqrt(192.0));
    BOOST_TEST(c.moe.n_routed_experts == 256);
    BOOST_TEST(c.moe.top_k == 8);
    BOOST_TEST(c.moe.n_shared_experts == 1);
    BOOST_TEST(c.moe.shared_intermediate == 1024);
    BOOST_TEST(c.moe.n_group == 1);
    BOOST_TEST(c.moe.routed_scaling_factor == 2.446);
    BOOST_TEST((c.moe.scoring == Scoring::sigmoid));
    BOOST_TEST(c.moe.correction_bias);
    BOOST_TEST(!c.moe.weights_from_biased_scores);  // DeepSeek/vLLM semantics by default
    BOOST_TEST(c.bos_id == 163584);
    BOOST_TEST(c.eos_id == 163586);
    BOOST_TEST(c.pad_id == 163839);
}

BOOST_AUTO_TEST_CASE(deepseek_v32_layout) {
    ModelConfig c = load_model_config(deepseek_path);
    BOOST_TEST(c.model_type == "deepseek_v32");
    BOOST_REQUIRE_EQUAL(c.layers.size(), 61u);
    for (int i = 0; i < 61; ++i) {
        BOOST_TEST_CONTEXT("layer " << i) {
            BOOST_TEST((c.layers[i].mixer == Mixer::dsa));
            BOOST_TEST(!c.layers[i].gated);
            BOOST_TEST((c.layers[i].ffn == (i < 3 ? Ffn::dense : Ffn::moe)));
        }
    }
    BOOST_TEST(c.indexer.n_head == 64);
    BOOST_TEST(c.indexer.head_dim == 128);
    BOOST_TEST(c.quant.fp8);  // the published checkpoint: e4m3 weights in 128 × 128 blocks
    BOOST_TEST(c.quant.block_rows == 128);
    BOOST_TEST(c.quant.block_cols == 128);
    BOOST_TEST(c.indexer.top_k == 2048);
    BOOST_TEST(c.mla.q_lora_rank == 1536);
    BOOST_TEST(!c.mla.nope);
    BOOST_TEST((c.mla.rope_scaling == RopeScaling::yarn));
    BOOST_TEST(c.mla.yarn_factor == 40.0);
    BOOST_TEST(c.mla.yarn_original_max_position == 4096);
    // τ = 192^{-1/2} · m², m = 0.1·ln(40) + 1 (mscale_all_dim 1; DS32 softmax_scale).
    double m = 0.1 * std::log(40.0) + 1.0;
    BOOST_TEST(mla_softmax_scale(c.mla) == m * m / std::sqrt(192.0),
               boost::test_tools::tolerance(1e-12));
    BOOST_TEST(c.moe.n_group == 8);
    BOOST_TEST(c.moe.topk_group == 4);
    BOOST_TEST(c.moe.top_k == 8);
    BOOST_TEST(c.moe.routed_scaling_factor == 2.5);
    BOOST_TEST(c.moe.correction_bias);  // topk_method noaux_tc
    BOOST_TEST(c.n_mtp_layers == 1);
    BOOST_TEST(c.rms_norm_eps == 1e-6);
}

// Published: Kimi-Linear "48B total, 3B activated"; DeepSeek-V3 family "671B total, 37B activated"
// (main model, without the MTP module). Differences, all expected:
// * Kimi total 49.12B is 2.3% above the rounded name "48B".
// * Kimi active 3.48B counts the embedding and head (0.75B); without them 2.73B. The rounded "3B"
//   lies between the two conventions, which is what is asserted.
// * DeepSeek-V3.2 active 38.40B is 3.8% above 37B: the lightning indexers (61 × 13.96M = 0.85B)
//   are new in V3.2 and not in V3's 37B; without them 37.55B (1.5%).
// * DeepSeek-V3.2 total 671.88B includes the same indexers (V3: 671.03B). The exact check below
//   rebuilds the HF checkpoint's parameter count (main + MTP layer + FP8 scales).
BOOST_AUTO_TEST_CASE(param_counts_match_published) {
    ModelConfig kimi = load_model_config(kimi_path);
    ParamCount k = count_params(kimi);
    BOOST_TEST(k.total == 49'122'681'728);
    BOOST_TEST(k.active == 3'484'459'904);
    BOOST_TEST(k.embedding == 2 * 163840LL * 2304);
    BOOST_TEST(rel_diff(k.total, 48e9) < 0.03);
    BOOST_TEST(k.active - k.embedding < 3.0e9);
    BOOST_TEST(k.active > 3.0e9);

    ModelConfig ds = load_model_config(deepseek_path);
    ParamCount p = count_params(ds);
    BOOST_TEST(p.total == 671'877'944'064);
    BOOST_TEST(p.active == 38'403'822'336);
    BOOST_TEST(rel_diff(p.total, 671e9) < 0.01);
    BOOST_TEST(rel_diff(p.active, 37e9) < 0.05);

    // The HF checkpoint lists 685,396,921,376 parameters: the main model, plus the MTP layer 61
    // (a DSA + MoE layer with its own embed_tokens, shared_head.{head,norm}, eh_proj [d, 2d],
    // enorm, hnorm), plus the fp32 weight_scale_inv [ceil(out/128), ceil(in/128)] of every FP8
    // weight (all projections of layers 0-61 except the router, indexer weights_proj and eh_proj).
    const int64_t d = ds.hidden_size;
    ModelConfig one = ds;
    one.layers = {LayerSpec{Mixer::dsa, false, Ffn::moe}};
    int64_t mtp = count_params(one).total + 2 * d * d + 2 * d;
    auto blocks = [](int64_t out, int64_t in) { return ((out + 127) / 128) * ((in + 127) / 128); };
    int64_t attn_scales = blocks(128, d) + blocks(8192, 1536) + blocks(576, d) +
                          blocks(32768, 512) + blocks(d, 16384) + blocks(1536, d) +
                          blocks(24576, 1536);
    int64_t dense_scales = 2 * blocks(18432, d) + blocks(d, 18432);
    int64_t expert_scales = 257 * (2 * blocks(2048, d) + blocks(d, 2048));  // 256 + shared
    int64_t scales = 62 * attn_scales + 3 * dense_scales + 59 * expert_scales;
    BOOST_TEST(p.total + mtp + scales == 685'396'921'376);
}

// The tiny preset counted by hand: embedding + head 32,768, final norm 64, block norms 8 × 64,
// KDA 3 × 21,588, gated DSA 30,304 (MLA 15,936 + output gate 4,096 + indexer 10,272),
// dense 3·64·128 = 24,576, MoE 3 × 55,816 (active 3 × 18,952), vision 45,600.
BOOST_AUTO_TEST_CASE(tiny_file_equals_preset) {
    ModelConfig file = load_model_config(tiny_path);
    ModelConfig preset = preset_config("tiny");
    BOOST_TEST((file == preset));
    BOOST_TEST(layer_pattern(preset) == "KKKG");
    BOOST_TEST(ffn_pattern(preset) == "-EEE");
    BOOST_TEST((preset.layers[3] == LayerSpec{Mixer::dsa, true, Ffn::moe}));
    BOOST_TEST(preset.vocab_size == 256);
    BOOST_TEST(preset.hidden_size == 64);
    BOOST_TEST(preset.rms_norm_eps == 1e-5);
    BOOST_TEST(preset.indexer.n_head == 16);
    BOOST_TEST(preset.indexer.top_k == 8);
    BOOST_TEST(preset.moe.latent_size == 32);
    BOOST_TEST(preset.vision.present);
    ParamCount pc = count_params(preset);
    BOOST_TEST(pc.total == 366'036);
    BOOST_TEST(pc.active == 209'844);
    BOOST_TEST(pc.vision == 45'600);
}

BOOST_AUTO_TEST_CASE(presets_round_trip_and_flagship_size) {
    const std::vector<std::string> names = preset_names();
    BOOST_TEST(names.size() == 5u);
    for (const std::string& name : names) {
        BOOST_TEST_CONTEXT("preset " << name) {
            ModelConfig c = preset_config(name);
            ModelConfig back = parse_model_config(to_json(c), "round trip");
            back.model_type = c.model_type;  // the native format always says "hymoe"
            BOOST_TEST((back == c));
            BOOST_TEST(!describe(c).empty());
        }
    }
    ModelConfig f = preset_config("flagship-2.8t");
    ParamCount pc = count_params(f);
    BOOST_TEST(pc.total > 2.7e12);
    BOOST_TEST(pc.total < 2.9e12);
    BOOST_TEST(f.moe.n_routed_experts == 896);
    BOOST_TEST(f.moe.top_k == 16);
    BOOST_TEST(f.indexer.top_k == 2048);
    BOOST_TEST(f.max_position == 1048576);
    BOOST_TEST(count_layers(f, Mixer::kda) == 3 * count_layers(f, Mixer::dsa));
    BOOST_TEST(count_layers(f, Ffn::latent_moe) == static_cast<int>(f.layers.size()) - 1);
    for (const LayerSpec& s : f.layers)
        BOOST_TEST(s.gated == (s.mixer == Mixer::dsa));

    expect_invalid([] { preset_config("huge"); }, {"huge", "tiny", "flagship-2.8t"});
}

BOOST_AUTO_TEST_CASE(native_patterns_and_stages) {
    TempDir dir;
    Json j = read_json(tiny_path);
    j["layer_pattern"] = "KK KG | K KKG";
    j["ffn_pattern"] = "-EEE | LEEE";
    ModelConfig c = load_model_config(dir.write("staged.json", j.dump()));
    BOOST_TEST(c.layers.size() == 8u);
    BOOST_TEST(c.stage_boundaries == std::vector<int>{4});
    BOOST_TEST((c.layers[4].ffn == Ffn::latent_moe));
    BOOST_TEST(layer_pattern(c) == "KKKG | KKKG");
    BOOST_TEST(ffn_pattern(c) == "-EEE | LEEE");
    j["layer_pattern"] = "MADG";
    j["ffn_pattern"] = "EEEE";
    c = load_model_config(dir.write("mixers.json", j.dump()));
    BOOST_TEST((c.layers[0] == LayerSpec{Mixer::mla, false, Ffn::moe}));
    BOOST_TEST((c.layers[1] == LayerSpec{Mixer::mla, true, Ffn::moe}));
    BOOST_TEST((c.layers[2] == LayerSpec{Mixer::dsa, false, Ffn::moe}));
    BOOST_TEST((c.layers[3] == LayerSpec{Mixer::dsa, true, Ffn::moe}));
}

BOOST_AUTO_TEST_CASE(malformed_configs_name_the_key) {
    TempDir dir;
    const Json kimi = read_json(kimi_path), ds = read_json(deepseek_path),
               tiny = read_json(tiny_path);
    struct Case {
        const char* name;
        const Json& base;
        std::function<void(Json&)> edit;
        std::vector<std::string> expect;  // besides the file path
    };
    const std::vector<Case> cases = {
        {"missing_key", kimi, [](Json& j) { j.erase("hidden_size"); }, {"hidden_size", "missing"}},
        {"wrong_type",
         kimi,
         [](Json& j) { j["hidden_size"] = "2304"; },
         {"hidden_size", "expected an integer"}},
        {"unknown_type", kimi, [](Json& j) { j["model_type"] = "llama"; }, {"model_type", "llama"}},
        {"kda_overlap",
         kimi,
         [](Json& j) { j["linear_attn_config"]["full_attn_layers"].push_back(5); },
         {"linear_attn_config.kda_layers: layer 5 is listed in both kda_layers and "
          "full_attn_layers"}},
        {"kda_gap",
         kimi,
         [](Json& j) { j["linear_attn_config"]["kda_layers"].erase(6); },  // the 9
         {"linear_attn_config.kda_layers", "layer 9", "neither"}},
        {"kda_range",
         kimi,
         [](Json& j) { j["linear_attn_config"]["kda_layers"].push_back(28); },
         {"linear_attn_config.kda_layers[20]", "at most 27"}},
        {"kimi_top_k",
         kimi,
         [](Json& j) { j["num_experts_per_token"] = 300; },
         {"num_experts_per_token", "256"}},
        {"kimi_act", kimi, [](Json& j) { j["hidden_act"] = "gelu"; }, {"hidden_act", "gelu"}},
        {"ds_topk_group", ds, [](Json& j) { j["topk_group"] = 9; }, {"topk_group", "8 groups"}},
        {"ds_quant_method",
         ds,
         [](Json& j) { j["quantization_config"]["quant_method"] = "awq"; },
         {"quantization_config.quant_method", "awq"}},
        {"ds_quant_fmt",
         ds,
         [](Json& j) { j["quantization_config"]["fmt"] = "e5m2"; },
         {"quantization_config.fmt", "e5m2"}},
        {"ds_quant_blocks",
         ds,
         [](Json& j) { j["quantization_config"]["weight_block_size"] = {128}; },
         {"quantization_config.weight_block_size", "two block sides"}},
        {"ds_quant_block_type",
         ds,
         [](Json& j) {
             j["quantization_config"]["weight_block_size"] = {128, "128"};
         },
         {"quantization_config.weight_block_size[1]"}},
        {"ds_q_lora",
         ds,
         [](Json& j) { j["q_lora_rank"] = nullptr; },
         {"q_lora_rank", "DSA layers need a query latent"}},
        {"ds_rope",
         ds,
         [](Json& j) { j["rope_scaling"]["type"] = "linear"; },
         {"rope_scaling.type", "linear"}},
        {"ds_bos", ds, [](Json& j) { j["bos_token_id"] = 129280; }, {"bos_token_id", "outside"}},
        {"pattern_length",
         tiny,
         [](Json& j) { j["ffn_pattern"] = "-EE"; },
         {"ffn_pattern", "has 3 layers but layer_pattern has 4"}},
        {"pattern_letter",
         tiny,
         [](Json& j) { j["layer_pattern"] = "KKXG"; },
         {"layer_pattern", "'X'"}},
        {"pattern_stage",
         tiny,
         [](Json& j) { j["layer_pattern"] = "| KKKG"; },
         {"layer_pattern", "before the first layer"}},
        {"stage_mismatch",
         tiny,
         [](Json& j) { j["ffn_pattern"] = "-E | EE"; },
         {"ffn_pattern", "stage boundaries"}},
        {"unknown_key", tiny, [](Json& j) { j["moe"]["topk"] = 2; }, {"moe.topk", "unknown key"}},
        {"missing_section",
         tiny,
         [](Json& j) { j.erase("indexer"); },
         {"indexer", "missing", "needed by 1 DSA layer"}},
        {"native_top_k",
         tiny,
         [](Json& j) { j["moe"]["top_k"] = 9; },
         {"moe.top_k", "at most the 8 routed experts"}},
        {"native_groups",
         tiny,
         [](Json& j) { j["moe"]["n_group"] = 3; },
         {"moe.n_group", "divide"}},
        {"native_latent",
         tiny,
         [](Json& j) {
             j["ffn_pattern"] = "-EEL";
             j["moe"]["latent_size"] = 0;
         },
         {"moe.latent_size", "at least 1"}},
        {"vision_heads", tiny, [](Json& j) { j["vision"]["n_head"] = 3; }, {"vision.n_head"}},
        {"biased_weights",
         tiny,
         [](Json& j) {
             j["moe"]["correction_bias"] = false;
             j["moe"]["weights_from_biased_scores"] = true;
         },
         {"moe.weights_from_biased_scores"}},
        {"rope_key",
         tiny,
         [](Json& j) {
             j["mla"]["rope_scaling"] = {{"type", "yarn"},
                                         {"factor", 4},
                                         {"original_max_position_embeddings", 64},
                                         {"betafast", 32}};
         },
         {"mla.rope_scaling.betafast", "unknown key"}},
        {"negative_eps",
         tiny,
         [](Json& j) { j["mla"]["norm_eps"] = -1.0; },
         {"mla.norm_eps", "positive"}},
    };
    for (const Case& c : cases) {
        BOOST_TEST_CONTEXT("case " << c.name) {
            Json j = c.base;
            c.edit(j);
            std::string path = dir.write(std::string(c.name) + ".json", j.dump(2));
            std::vector<std::string> expect = c.expect;
            expect.push_back(path + ": ");
            expect_invalid([&] { load_model_config(path); }, expect);
        }
    }

    std::string missing = (dir.path / "absent" / "config.json").string();
    expect_invalid([&] { load_model_config(missing); }, {missing, "cannot open"});
    std::string bad = dir.write("bad.json", "{\"model_type\": \"hymoe\",\n  \"vocab_size\": }");
    expect_invalid([&] { load_model_config(bad); }, {bad, "not valid JSON", "line 2"});
    std::string array = dir.write("array.json", "[1, 2]");
    expect_invalid([&] { load_model_config(array); }, {array, "JSON object"});
}

BOOST_AUTO_TEST_SUITE_END()
