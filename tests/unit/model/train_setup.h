// The training tests' model and batch (tests/unit/model/test_train.cpp, tests/cuda/test_train.cpp):
// a tiny preset with LoRA adapters on every target (attention q/k/v/o, dense and shared-expert
// FFNs, routed experts), B drawn small and nonzero so every path carries gradient, and a packed
// batch of two documents.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "hymoe/core/rng.h"
#include "hymoe/model/lora_model.h"
#include "hymoe/model/train.h"

namespace hymoe::train_test {

using namespace model;

inline const std::vector<std::string> kPresets = {"tiny", "tiny-kimi", "tiny-deepseek"};

// Two documents packed: 11 and 7 tokens, targets on every next token except a masked prefix.
inline TrainBatch two_docs(int64_t vocab) {
    TrainBatch b;
    b.batch = SeqBatch{{0, 11, 18}, {0, 0}, {}};
    for (int64_t s = 0; s < 2; ++s) {
        const int64_t begin = b.batch.offsets[s], end = b.batch.offsets[s + 1];
        for (int64_t t = begin; t < end; ++t)
            b.tokens.push_back((t * 29 + s * 7 + 3) % vocab);
        for (int64_t t = begin; t < end; ++t)
            b.targets.push_back(t + 1 < end && t - begin >= 2 ? b.tokens[t + 1] : -1);
    }
    return b;
}

struct Setup {
    Model m;
    LoraModel lm;
};

// A model with adapters on every target; B drawn small and nonzero.
inline void make(Setup& s, const std::string& preset, float dropout) {
    s.m = make_model(preset_config(preset));
    init_model_random(s.m, 11);
    std::vector<std::string> targets = {
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
    if (s.m.cfg.moe.n_routed_experts > 0)
        targets.insert(targets.end(), {"experts", "shared_experts"});
    s.lm = attach_lora(s.m, targets, false);
    add_lora_adapter(s.lm, s.m.shard, 4, 0.5f, 3, true);
    Philox rng(5, 0, 0);
    for (const TensorSpec& t : s.lm.tensors(0))
        if (t.name.find("lora_B") != std::string::npos)
            rng.fill_normal(
                t.dest->ptr<float>(), static_cast<size_t>(shape_numel(t.shape)), 0, 0.05f);
    for (LoraModule& mod : s.lm.modules)
        mod.slot->dropout = dropout, mod.slot->dropout_seed = 9;
}

inline void zero(LoraModel& lm) {
    for (const TensorSpec& g : lm.tensors(0, true))
        std::fill_n(g.dest->ptr<float>(), shape_numel(g.shape), 0.0f);
}

inline std::vector<float> grads(LoraModel& lm) {
    std::vector<float> out;
    for (const TensorSpec& g : lm.tensors(0, true))
        out.insert(out.end(), g.dest->ptr<float>(), g.dest->ptr<float>() + shape_numel(g.shape));
    return out;
}

}  // namespace hymoe::train_test
