// A tiny DeepSeek-V3.2-type FP8 checkpoint (tests/models/tiny-deepseek-fp8: hidden 256, dense FFN
// 384, experts 192 wide, quantization_config fp8 e4m3 in 128 × 128 blocks), made by quantizing a
// random model the documented way (tests/fp8_quant.h): its matrices F8_E4M3 with fp32
// weight_scale_inv in another shard, everything else BF16. Its dequantized twin holds the same
// values as F32 (the reference dequantization, and the BF16 tensors widened). The binary scores
// the FP8 folder exactly like the twin (prompt logprobs bit for bit, greedy tokens equal) at one
// rank and at tp 2 · dp 2 · ep 2, where tp cuts the dense FFN at row / column 192 and the shared
// expert at row 96, inside 128-blocks. A missing or misshapen scale tensor exits 3 naming the
// file and the tensor.
#include <cstring>
#include <filesystem>
#include <fstream>

#include <boost/test/unit_test.hpp>
#include <nlohmann/json.hpp>

#include "../fp8_quant.h"
#include "hymoe/core/types.h"
#include "hymoe/io/h5.h"
#include "hymoe/model/model.h"
#include "run_binary.h"

namespace fs = std::filesystem;
using namespace hymoe;
using hymoe::testing::RawTensor;

namespace {

const std::string kConfig = "tests/models/tiny-deepseek-fp8/config.json";
const std::vector<std::vector<int64_t>> kPrompts = {{1, 5, 9, 12, 40, 7}, {3, 3, 7}, {200, 17}};

// The matrices DeepSeek-V3.2 stores in FP8: the layers' projections and experts, not the norms,
// the router or the indexer's head weights (nor embedding and head, outside the layers).
bool quantized(const std::string& name, const Tensor& t) {
    return t.shape.size() == 2 && name.rfind("model.layers.", 0) == 0 &&
           name.find("norm") == std::string::npos &&
           name.find("mlp.gate.weight") == std::string::npos &&
           name.find("weights_proj") == std::string::npos;
}

enum class Break { none, drop_scale, bad_scale_shape };
const std::string kBroken = "model.layers.1.mlp.shared_experts.down_proj.weight";

// The FP8 folder at dir/fp8 (shard 1: weights, shard 2: scales) and its twin at dir/twin, each
// with config.json, prompts and a deck; `brk` spoils kBroken's scales in the FP8 folder.
void write_folders(const std::string& dir, Break brk = Break::none) {
    fs::remove_all(dir);
    model::Model m = model::make_model(model::load_model_config(kConfig));
    model::init_model_random(m, 31);
    std::vector<RawTensor> weights, scales, twin;
    nlohmann::json map = nlohmann::json::object();
    for (const model::TensorSpec& t : model::model_tensors(m)) {
        const Tensor& v = t.dest->view();
        const float* p = v.ptr<float>();
        if (quantized(t.name, v)) {
            const testing::Fp8Matrix q = testing::quantize_fp8(p, v.shape[0], v.shape[1], 128, 128);
            weights.push_back({t.name, "F8_E4M3", v.shape, {q.codes.begin(), q.codes.end()}});
            map[t.name] = "model-00001-of-00002.safetensors";
            std::vector<int64_t> s_shape = {q.scale_rows(), q.scale_cols()};
            std::vector<float> s = q.scale;
            if (t.name == kBroken && brk == Break::bad_scale_shape)
                s_shape = {1, 1}, s.resize(1);
            if (t.name != kBroken || brk != Break::drop_scale) {
                scales.push_back(testing::raw_f32(t.name + "_scale_inv", s_shape, s));
                map[t.name + "_scale_inv"] = "model-00002-of-00002.safetensors";
            }
            twin.push_back(testing::raw_f32(t.name, v.shape, q.dequantized()));
        } else {
            RawTensor b{t.name, "BF16", v.shape, std::vector<unsigned char>(v.bytes() / 2)};
            std::vector<float> widened(static_cast<size_t>(v.numel()));
            for (int64_t k = 0; k < v.numel(); ++k) {
                const uint16_t h = float_to_bf16(p[k]);
                std::memcpy(b.bytes.data() + 2 * k, &h, 2);
                widened[static_cast<size_t>(k)] = bf16_to_float(h);
            }
            weights.push_back(std::move(b));
            map[t.name] = "model-00001-of-00002.safetensors";
            twin.push_back(testing::raw_f32(t.name, v.shape, widened));
        }
    }
    for (const std::string sub : {"fp8", "twin"}) {
        const std::string d = dir + "/" + sub;
        fs::create_directories(d);
        fs::copy_file(kConfig, d + "/config.json");
        std::ofstream prompts(d + "/prompts.jsonl");
        for (size_t i = 0; i < kPrompts.size(); ++i)
            prompts
                << nlohmann::json{{"id", "p" + std::to_string(i)}, {"tokens", kPrompts[i]}}.dump()
                << "\n";
        std::ofstream(d + "/deck.yaml")
            << "job: {kind: infer, output: out}\n"
               "model: {config: config.json, weights: ., dtype: bf16}\n"
               "inference: {dataset: prompts.jsonl, prompt_logprobs: true}\n";
    }
    testing::write_raw_safetensors(dir + "/fp8/model-00001-of-00002.safetensors", weights);
    testing::write_raw_safetensors(dir + "/fp8/model-00002-of-00002.safetensors", scales);
    std::ofstream(dir + "/fp8/model.safetensors.index.json")
        << nlohmann::json{{"metadata", nlohmann::json::object()}, {"weight_map", map}}.dump(1);
    testing::write_raw_safetensors(dir + "/twin/model.safetensors", twin);
}

struct Scores {
    std::vector<float> logprobs;
    std::vector<int64_t> greedy;
};
Scores scores_of(const std::string& out) {
    io::H5Reader h5(out + "/results.h5");
    return {h5.floats("/requests/prompt_logprobs"), h5.ints("/requests/greedy_token")};
}
bool same_bits(const Scores& a, const Scores& b) {
    return a.logprobs.size() == b.logprobs.size() && !a.logprobs.empty() &&
           std::memcmp(a.logprobs.data(), b.logprobs.data(), a.logprobs.size() * 4) == 0 &&
           a.greedy == b.greedy;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(hf_fp8)

BOOST_AUTO_TEST_CASE(fp8_folder_scores_exactly_like_its_dequantized_twin) {
    const std::string dir = "build/e2e/fp8";
    write_folders(dir);
    const std::string par =
        " --set job.output=out4 --set parallel.tp=2 --set parallel.dp=2 "
        "--set parallel.ep=2";
    for (const std::string sub : {"fp8", "twin"}) {
        auto one = testing::run_hymoe(dir + "/" + sub + "/deck.yaml");
        BOOST_REQUIRE_MESSAGE(one.code == 0, one.err);
        auto four = testing::run_hymoe(dir + "/" + sub + "/deck.yaml" + par, 4);
        BOOST_REQUIRE_MESSAGE(four.code == 0, four.err);
    }
    BOOST_TEST(same_bits(scores_of(dir + "/fp8/out"), scores_of(dir + "/twin/out")));
    BOOST_TEST(same_bits(scores_of(dir + "/fp8/out4"), scores_of(dir + "/twin/out4")));
    fs::remove_all(dir);
}

BOOST_AUTO_TEST_CASE(a_missing_or_misshapen_scale_exits_3_naming_file_and_tensor) {
    const std::string dir = "build/e2e/fp8_bad";
    write_folders(dir, Break::drop_scale);
    auto r = testing::run_hymoe(dir + "/fp8/deck.yaml");
    BOOST_TEST(r.code == 3);
    BOOST_TEST(r.err.find("model-00001-of-00002.safetensors: tensor '" + kBroken + "'") !=
                   std::string::npos,
               r.err);
    BOOST_TEST(r.err.find("'" + kBroken + "_scale_inv' are missing") != std::string::npos, r.err);

    write_folders(dir, Break::bad_scale_shape);
    r = testing::run_hymoe(dir + "/fp8/deck.yaml");
    BOOST_TEST(r.code == 3);
    BOOST_TEST(r.err.find("model-00002-of-00002.safetensors: tensor '" + kBroken +
                          "_scale_inv' is F32 [1, 1]") != std::string::npos,
               r.err);
    BOOST_TEST(r.err.find("are float [2, 2]") != std::string::npos, r.err);
    BOOST_TEST(!fs::exists(dir + "/fp8/out/results.h5"));
    fs::remove_all(dir);
}

BOOST_AUTO_TEST_SUITE_END()
