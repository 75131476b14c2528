// The plan's LoRA parameter count (runtime/plan.h StagePlan::lora_params) against the adapters the
// model actually attaches (model/lora_model.h) at one rank: every target alone, all of them, and
// per-expert adapters, on each built-in tiny preset (KDA, MLA with and without a query latent,
// DSA, dense and MoE layers, shared experts). The plan sizes the training state from this count.
#include <string>
#include <vector>

#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include "hymoe/deck/deck.h"
#include "hymoe/model/config.h"
#include "hymoe/model/lora_model.h"
#include "hymoe/model/model.h"
#include "hymoe/runtime/plan.h"

namespace data = boost::unit_test::data;
namespace model = hymoe::model;
namespace rt = hymoe::runtime;

namespace {

const std::vector<std::vector<std::string>> kTargetSets = {{"q_proj"},
                                                           {"k_proj"},
                                                           {"v_proj"},
                                                           {"k_proj", "v_proj"},
                                                           {"o_proj"},
                                                           {"gate_proj"},
                                                           {"up_proj"},
                                                           {"down_proj"},
                                                           {"experts"},
                                                           {"shared_experts"},
                                                           {"q_proj",
                                                            "k_proj",
                                                            "v_proj",
                                                            "o_proj",
                                                            "gate_proj",
                                                            "up_proj",
                                                            "down_proj",
                                                            "experts",
                                                            "shared_experts"}};

const char* kPresets[] = {"tiny", "tiny-kimi", "tiny-deepseek"};

int64_t attached_params(const model::ModelConfig& cfg,
                        const std::vector<std::string>& targets,
                        bool per_expert) {
    model::Model m = model::make_model(cfg);
    model::init_model_random(m, 7);
    model::LoraModel lm = model::attach_lora(m, targets, per_expert, false);
    model::add_lora_adapter(lm, model::whole_model(cfg), 4, 1.0f, 7, true);
    return model::lora_local_params(lm);
}

int64_t planned_params(const model::ModelConfig& cfg,
                       const std::vector<std::string>& targets,
                       bool per_expert) {
    hymoe::deck::Deck d;
    d.job.kind = hymoe::deck::JobKind::lora;
    d.finetune.present = true;
    d.finetune.lora.rank = 4;
    d.finetune.lora.target_modules = targets;
    d.finetune.lora.per_expert = per_expert;
    return rt::make_plan(cfg, hymoe::parallel::Layout{}, d).stages[0].lora_params;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(plan_lora)

BOOST_DATA_TEST_CASE(plan_counts_the_adapters_the_model_attaches,
                     data::make(kPresets) * data::make({false, true}),
                     preset,
                     per_expert) {
    const model::ModelConfig cfg = model::preset_config(preset);
    for (const auto& targets : kTargetSets) {
        std::string names;
        for (const std::string& t : targets)
            names += t + " ";
        BOOST_TEST_CONTEXT(preset << " targets " << names << "per_expert " << per_expert) {
            BOOST_TEST(planned_params(cfg, targets, per_expert) ==
                       attached_params(cfg, targets, per_expert));
        }
    }
}

BOOST_AUTO_TEST_SUITE_END()
