// Several adapters in one batch (one base model, many scenarios): on every target (attention
// q/k/v/o, dense and shared-expert FFNs, every routed expert), a packed batch whose sequences use
// adapter 0, adapter 1 and the base model gives each sequence the logits of its adapter's merged
// weights (W + s·BA, model/lora_model.h) on that sequence alone, or of the bare base model
// (≤ 1e-4), and the adapters do change the logits.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include "hymoe/core/rng.h"
#include "hymoe/model/lora_model.h"

namespace data = boost::unit_test::data;
using namespace hymoe;
using namespace hymoe::model;

namespace {

const std::vector<std::string> kPresets = {"tiny", "tiny-kimi", "tiny-deepseek"};

// The preset's model (fixed seed) with two adapters on every target, B drawn nonzero; with
// `merge` ≥ 0, that adapter merged into the weights and the slots emptied; −1: the bare model.
Model adapted_model(const std::string& preset, int merge, LoraModel& lm) {
    Model m = make_model(preset_config(preset));
    init_model_random(m, 3);
    if (merge == -1)
        return m;
    std::vector<std::string> targets = {
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
    if (m.cfg.moe.n_routed_experts > 0)
        targets.insert(targets.end(), {"experts", "shared_experts"});
    lm = attach_lora(m, targets, true);
    for (int a = 0; a < 2; ++a) {
        add_lora_adapter(lm, m.shard, 4, 1.0f, 10 + a, false);
        Philox rng(20 + a, 0, 0);
        for (const TensorSpec& t : lm.tensors(a))
            if (t.name.find("lora_B") != std::string::npos)
                rng.fill_normal(
                    t.dest->ptr<float>(), static_cast<size_t>(shape_numel(t.shape)), 0, 0.2f);
    }
    if (merge < 2)
        merge_lora(lm, merge);
    return m;
}

// The logits [n, V] of one sequence alone on m (no adapter).
std::vector<float> alone(const Model& m, const std::vector<int64_t>& tokens) {
    SequenceState st = make_sequence_state(m);
    Buffer logits;
    forward(m, tokens, single_sequence(static_cast<int64_t>(tokens.size())), {&st}, logits);
    return {logits.ptr<float>(), logits.ptr<float>() + logits.view().numel()};
}

float max_abs_diff(const float* a, const std::vector<float>& b) {
    float d = 0;
    for (size_t i = 0; i < b.size(); ++i)
        d = std::max(d, std::abs(a[i] - b[i]));
    return d;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(lora_requests)

BOOST_DATA_TEST_CASE(each_sequence_gets_its_own_adapter_on_every_target,
                     data::make(kPresets),
                     preset) {
    LoraModel lm, lm0, lm1, none;
    const Model m = adapted_model(preset, 2, lm);  // both adapters in slots
    const Model merged0 = adapted_model(preset, 0, lm0), merged1 = adapted_model(preset, 1, lm1);
    const Model base = adapted_model(preset, -1, none);
    const int64_t V = m.cfg.vocab_size;
    const std::vector<int> adapters = {1, -1, 0, 1};
    const std::vector<int64_t> lengths = {9, 5, 12, 3};
    std::vector<int64_t> tokens;
    SeqBatch batch{{0}, {}, adapters};
    std::vector<std::vector<int64_t>> seqs;
    for (size_t s = 0; s < lengths.size(); ++s) {
        std::vector<int64_t>& t = seqs.emplace_back();
        for (int64_t i = 0; i < lengths[s]; ++i)
            t.push_back((i * 31 + static_cast<int64_t>(s) * 17 + 2) % V);
        tokens.insert(tokens.end(), t.begin(), t.end());
        batch.offsets.push_back(batch.offsets.back() + lengths[s]);
        batch.pos0.push_back(0);
    }
    std::vector<SequenceState> states;
    for (size_t s = 0; s < seqs.size(); ++s)
        states.push_back(make_sequence_state(m));
    std::vector<SequenceState*> ptrs;
    for (SequenceState& st : states)
        ptrs.push_back(&st);
    Buffer logits;  // [n_tok, V]
    forward(m, tokens, batch, ptrs, logits);
    for (size_t s = 0; s < seqs.size(); ++s) {
        const float* packed = logits.ptr<float>() + batch.offsets[s] * V;
        const Model& ref = adapters[s] == 0 ? merged0 : adapters[s] == 1 ? merged1 : base;
        BOOST_TEST(max_abs_diff(packed, alone(ref, seqs[s])) <= 1e-4f, preset << " seq " << s);
        if (adapters[s] >= 0)  // the adapter is on: the base model differs
            BOOST_TEST(max_abs_diff(packed, alone(base, seqs[s])) > 1e-2f, preset << " " << s);
    }
}

BOOST_AUTO_TEST_SUITE_END()
