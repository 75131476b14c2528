// The plan job end to end: the 2.8T flagship plans on one rank (nothing is allocated) and writes
// /plan and /search to plan.h5; --check prints the same plan for other kinds; and the plan's
// weight bytes for the tiny preset in fp32 equal, block by block, the bytes of the weights the
// real scoring job loads (model::model_tensors after init, summed by block from the HF names).
#include <filesystem>
#include <map>
#include <string>

#include <boost/test/unit_test.hpp>

#include "hymoe/deck/deck.h"
#include "hymoe/io/h5.h"
#include "hymoe/model/model.h"
#include "hymoe/runtime/plan.h"
#include "run_binary.h"

namespace fs = std::filesystem;
namespace rt = hymoe::runtime;
using hymoe::testing::read_text;
using hymoe::testing::run_hymoe;

namespace {

bool contains(const std::string& s, const std::string& part) {
    return s.find(part) != std::string::npos;
}

// The plan block of an HF tensor name of a hymoe-family model (model/model.cpp's names).
rt::PlanBlock block_of(const hymoe::model::ModelConfig& cfg, const std::string& name) {
    using rt::PlanBlock;
    if (name == "model.embed_tokens.weight")
        return PlanBlock::embedding;
    if (name == "lm_head.weight")
        return PlanBlock::head;
    if (name == "model.norm.weight" ||
        (contains(name, "layernorm.weight") && !contains(name, "self_attn.")))
        return PlanBlock::norms;
    const size_t at = std::string("model.layers.").size();
    const int layer = std::stoi(name.substr(at));
    const hymoe::model::LayerSpec& s = cfg.layers[layer];
    if (contains(name, ".self_attn.")) {
        if (s.mixer == hymoe::model::Mixer::kda)
            return PlanBlock::kda;
        return contains(name, ".indexer.") ? PlanBlock::indexer : PlanBlock::mla;
    }
    if (s.ffn == hymoe::model::Ffn::dense)
        return PlanBlock::dense_ffn;
    if (contains(name, ".shared_experts."))
        return PlanBlock::shared_experts;
    if (contains(name, ".experts."))
        return PlanBlock::routed_experts;
    if (contains(name, "latent_proj"))
        return PlanBlock::latent_proj;
    return PlanBlock::router;  // gate.weight, gate.e_score_correction_bias
}

}  // namespace

BOOST_AUTO_TEST_SUITE(plan_job)

BOOST_AUTO_TEST_CASE(flagship_plans_on_one_rank_and_writes_search_and_plan) {
    const std::string out = "jobs/plan-flagship/out";
    fs::remove_all(out);
    auto r = run_hymoe("jobs/plan-flagship/deck.yaml", 1);
    BOOST_TEST(r.code == 0, r.err);
    BOOST_REQUIRE(fs::exists(out + "/plan.h5"));
    const std::string log = read_text(out + "/log");
    BOOST_TEST(contains(log, "plan at the deck's layout"));
    BOOST_TEST(contains(log, "does NOT fit"));  // one GPU cannot hold 5.7 TB
    BOOST_TEST(contains(log, "layout search: 512 GPUs"));
    BOOST_TEST(contains(log, "plan of the best layout found"));
    BOOST_TEST(contains(log, "memory per rank (GB)"));
    BOOST_TEST(contains(log, "time model:"));
    hymoe::io::H5Reader h5(out + "/plan.h5");
    BOOST_TEST(h5.exists("/meta/deck"));
    BOOST_TEST(h5.shape("/grid/coords") == hymoe::Shape({1, 6}));
    BOOST_TEST(h5.ints("/plan/total_params") == std::vector<int64_t>({2'847'219'879'024}));
    BOOST_TEST(h5.ints("/plan/fits") == std::vector<int64_t>({0}));
    BOOST_TEST(h5.shape("/plan/weight_bytes") == hymoe::Shape({1, rt::kPlanBlocks}));
    BOOST_TEST(h5.attr("/plan/weight_bytes", "units") == "bytes per rank");
    BOOST_TEST(h5.strings("/plan/blocks").size() == static_cast<size_t>(rt::kPlanBlocks));
    BOOST_TEST(h5.ints("/search/gpus") == std::vector<int64_t>({512}));
    const hymoe::Shape layouts = h5.shape("/search/layouts");
    BOOST_REQUIRE(layouts.size() == 2u);
    BOOST_TEST(layouts[1] == 6);
    const std::vector<int64_t> fits = h5.ints("/search/fits");
    BOOST_TEST(static_cast<int64_t>(fits.size()) == layouts[0]);
    BOOST_TEST(fits.front() == 1);  // the best first
    const std::vector<int64_t> l = h5.ints("/search/layouts");
    BOOST_TEST(l[0] * l[1] * l[2] == 512);  // tp·dp·pp
    BOOST_TEST(h5.ints("/search/best/fits") == std::vector<int64_t>({1}));
    BOOST_TEST(h5.ints("/search/best/layout") == std::vector<int64_t>(l.begin(), l.begin() + 6));
    BOOST_TEST(h5.ints("/search/best/peak_bytes")[0] <= 141'000'000'000);
    BOOST_TEST(h5.exists("/search/rules"));
    BOOST_TEST(h5.attr("/search/best/step_seconds", "units") == "s");
    fs::remove_all(out);
}

BOOST_AUTO_TEST_CASE(check_prints_the_plan_for_other_kinds) {
    auto r = run_hymoe("tests/decks/score/deck.yaml --check");
    BOOST_TEST(r.code == 0, r.err);
    BOOST_TEST(contains(r.out, "plan at the deck's layout: tp 1 x pp 1 x dp 1"));
    BOOST_TEST(contains(r.out, "weights (fp32)"));
    BOOST_TEST(contains(r.out, "check passed"));
    BOOST_TEST(!fs::exists("tests/decks/score/out"));
}

// The memory check: the scoring job runs the tiny model in fp32 on one rank; its weights are
// model_tensors(make_model + init_model_random) (runtime's build for init: random). The plan's
// bytes per block equal theirs; the plan also counts the vision tower, which the text model
// does not load.
BOOST_AUTO_TEST_CASE(planned_weight_bytes_equal_the_loaded_weights) {
    const std::string path = "tests/decks/score/deck.yaml";
    fs::remove_all("tests/decks/score/out");
    auto r = run_hymoe(path, 1);
    BOOST_TEST(r.code == 0, r.err);
    fs::remove_all("tests/decks/score/out");

    hymoe::deck::Deck d = hymoe::deck::parse_deck(hymoe::deck::read_deck_file(path), path, {});
    BOOST_REQUIRE(d.model.dtype == hymoe::DType::f32);
    for (const std::string& preset :
         {d.model.preset, std::string("tiny-kimi"), std::string("tiny-deepseek")}) {
        BOOST_TEST_CONTEXT(preset) {
            hymoe::model::Model m = hymoe::model::make_model(hymoe::model::preset_config(preset));
            hymoe::model::init_model_random(m, d.job.seed);
            std::map<rt::PlanBlock, double> loaded;
            double total = 0;
            for (const hymoe::model::TensorSpec& t : hymoe::model::model_tensors(m)) {
                const double bytes = static_cast<double>(t.dest->view().bytes());
                loaded[block_of(m.cfg, t.name)] += bytes;
                total += bytes;
            }
            rt::Plan p = rt::make_plan(m.cfg, hymoe::parallel::Layout{}, d);
            const rt::StagePlan& s = p.stages[0];
            for (int b = 0; b < rt::kPlanBlocks; ++b) {
                const auto block = static_cast<rt::PlanBlock>(b);
                if (block == rt::PlanBlock::vision)
                    continue;
                BOOST_TEST(static_cast<double>(s.params[b]) * 4 == loaded[block],
                           rt::to_string(block));
            }
            const double vision =
                static_cast<double>(s.params[static_cast<size_t>(rt::PlanBlock::vision)] * 4);
            BOOST_TEST(s.mem.weights - vision == total);
        }
    }
}

BOOST_AUTO_TEST_SUITE_END()
