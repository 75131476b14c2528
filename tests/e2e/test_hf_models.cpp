// Tiny Kimi-Linear-type and DeepSeek-V3.2-type models as HF folders (tests/models/*/config.json
// in each family's real format + safetensors shards written here with an index): the config reads
// back equal to the built-in preset, the binary loads the folder and scores prompts, and its
// results equal an in-process forward over the same weights, and the same at 8 ranks reading
// their slices. A tensor missing from the shards exits 3 naming it.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>
#include <nlohmann/json.hpp>

#include "hymoe/io/h5.h"
#include "hymoe/io/safetensors.h"
#include "hymoe/model/model.h"
#include "run_binary.h"

namespace fs = std::filesystem;
namespace data = boost::unit_test::data;
using namespace hymoe;

namespace {

const std::vector<std::vector<int64_t>> kPrompts = {{1, 5, 9, 12, 40}, {3, 3, 7}, {200, 17, 42}};

// A sharded HF folder: config.json, two shards split at layer 2, model.safetensors.index.json.
// `drop` names a tensor left out of the shards (but kept in the index).
void write_folder(const std::string& dir,
                  const std::string& family,
                  model::Model& m,
                  const std::string& drop = "") {
    fs::remove_all(dir);
    fs::create_directories(dir);
    fs::copy_file("tests/models/" + family + "/config.json", dir + "/config.json");
    std::vector<std::pair<std::string, Tensor>> shard[2];
    nlohmann::json index = {{"metadata", {{"total_size", 0}}},
                            {"weight_map", nlohmann::json::object()}};
    for (const model::TensorSpec& t : model::model_tensors(m)) {
        const bool late = t.name.rfind("model.layers.2.", 0) == 0 ||
                          t.name.rfind("model.layers.3.", 0) == 0 ||
                          t.name.rfind("model.layers.", 0) != 0;
        const std::string file =
            late ? "model-00002-of-00002.safetensors" : "model-00001-of-00002.safetensors";
        index["weight_map"][t.name] = file;
        if (t.name != drop)
            shard[late ? 1 : 0].emplace_back(t.name, t.dest->view());
    }
    io::write_safetensors(dir + "/model-00001-of-00002.safetensors", shard[0], {}, DType::bf16);
    io::write_safetensors(dir + "/model-00002-of-00002.safetensors", shard[1], {}, DType::bf16);
    std::ofstream(dir + "/model.safetensors.index.json") << index.dump(2);
    std::ofstream prompts(dir + "/prompts.jsonl");
    for (size_t i = 0; i < kPrompts.size(); ++i)
        prompts << nlohmann::json{{"id", "p" + std::to_string(i)}, {"tokens", kPrompts[i]}}.dump()
                << "\n";
    std::ofstream(dir + "/deck.yaml")
        << "job: {kind: infer, output: out}\n"
           "model: {config: config.json, weights: ., dtype: bf16}\n"
           "inference: {dataset: prompts.jsonl, prompt_logprobs: true, kv_cache: {dtype: fp32}}\n";
}

const std::vector<std::string> kFamilies = {"tiny-kimi", "tiny-deepseek"};

}  // namespace

BOOST_AUTO_TEST_SUITE(hf_models)

BOOST_DATA_TEST_CASE(config_json_reads_back_as_the_preset, data::make(kFamilies), family) {
    BOOST_TEST((model::load_model_config("tests/models/" + family + "/config.json") ==
                model::preset_config(family)));
}

BOOST_DATA_TEST_CASE(folder_loads_and_scores_like_in_process, data::make(kFamilies), family) {
    const std::string dir = "build/e2e/" + family;
    model::Model src = model::make_model(model::preset_config(family));
    model::init_model_random(src, 21);
    write_folder(dir, family, src);
    auto r = testing::run_hymoe(dir + "/deck.yaml");
    BOOST_TEST(r.code == 0, r.err);

    // The reference reads the same bf16 shards into bf16 matrices, as the job does (model.dtype
    // bf16, the default: docs/guide/precision.md).
    model::Model m = model::make_model(model::load_model_config(dir + "/config.json"));
    m.weight_dtype = DType::bf16;
    io::SafetensorsFolder folder(dir);
    model::load_model_weights(m,
                              [&](const std::string& name, const model::TensorPart&, Tensor& dest) {
                                  folder.read(name, dest);
                              });
    io::H5Reader h5(dir + "/out/results.h5");
    std::vector<float> lp = h5.floats("/requests/prompt_logprobs");
    std::vector<int64_t> offsets = h5.ints("/requests/logprob_offsets");
    std::vector<int64_t> greedy = h5.ints("/requests/greedy_token");
    const int64_t V = m.cfg.vocab_size;
    float max_err = 0;
    for (size_t s = 0; s < kPrompts.size(); ++s) {
        const auto& p = kPrompts[s];
        model::SequenceState st = model::make_sequence_state(m);
        Buffer logits;
        model::forward(m, p, model::single_sequence(static_cast<int64_t>(p.size())), {&st}, logits);
        for (size_t t = 0; t + 1 < p.size(); ++t) {
            const float* row = logits.ptr<float>() + t * V;
            double mx = *std::max_element(row, row + V), sum = 0;
            for (int64_t j = 0; j < V; ++j)
                sum += std::exp(static_cast<double>(row[j]) - mx);
            const double expect = static_cast<double>(row[p[t + 1]]) - mx - std::log(sum);
            const double got = lp[offsets[s] + t];
            max_err = std::max(max_err, static_cast<float>(std::abs(got - expect)));
        }
        const float* last = logits.ptr<float>() + (p.size() - 1) * V;
        BOOST_TEST(greedy[s] == std::max_element(last, last + V) - last);
    }
    BOOST_TEST(max_err <= 1e-4f);

    // Eight ranks, every cut at once (tp 2 × dp 2 × pp 2, experts over ep 2 × etp 2): each rank
    // reads only its slices of the shards, and the scores equal the one-rank run.
    auto par = testing::run_hymoe(dir +
                                      "/deck.yaml --set job.output=out8 --set parallel.tp=2 "
                                      "--set parallel.dp=2 --set parallel.pp=2 "
                                      "--set parallel.ep=2 --set parallel.etp=2",
                                  8);
    BOOST_REQUIRE_MESSAGE(par.code == 0, par.err);
    io::H5Reader h8(dir + "/out8/results.h5");
    const std::vector<float> lp8 = h8.floats("/requests/prompt_logprobs");
    BOOST_REQUIRE(lp8.size() == lp.size());
    for (size_t i = 0; i < lp.size(); ++i)
        BOOST_TEST(std::abs(lp8[i] - lp[i]) <= 1e-5f * std::max(1.0f, std::abs(lp[i])));
    BOOST_TEST(h8.ints("/requests/greedy_token") == greedy);
    fs::remove_all(dir);
}

BOOST_AUTO_TEST_CASE(a_missing_tensor_exits_3_naming_it) {
    const std::string dir = "build/e2e/missing";
    model::Model src = model::make_model(model::preset_config("tiny-deepseek"));
    model::init_model_random(src, 22);
    const std::string name = "model.layers.2.self_attn.indexer.wk.weight";
    write_folder(dir, "tiny-deepseek", src, name);
    auto r = testing::run_hymoe(dir + "/deck.yaml");
    BOOST_TEST(r.code == 3);
    BOOST_TEST(r.err.find(name) != std::string::npos, r.err);
    BOOST_TEST(!fs::exists(dir + "/out/results.h5"));
    fs::remove_all(dir);
}

BOOST_AUTO_TEST_SUITE_END()
