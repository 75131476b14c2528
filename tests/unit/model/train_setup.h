// The training tests' model and batch (tests/unit/model/test_train.cpp, tests/cuda/test_train.cpp):
// a tiny preset with LoRA adapters on every target (attention q/k/v/o, dense and shared-expert
// FFNs, routed experts), B drawn small and nonzero so every path carries gradient, and a packed
// batch of two documents.
#pragma once

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "hymoe/core/rng.h"
#include "hymoe/model/lora_model.h"
#include "hymoe/model/train.h"
#include "hymoe/model/weights.h"

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

// A model with adapters on every target, its matrices held in `matrices` (Model::weight_dtype);
// B drawn small and nonzero.
inline void make(Setup& s, const std::string& preset, float dropout, DType matrices = DType::f32) {
    s.m = make_model(preset_config(preset));
    s.m.weight_dtype = matrices;
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

// m's fp32 matrices (weights.h stored_matrix: what model.dtype bf16 holds in bf16) rounded in
// place to bf16 values: the fp32 twin of the model make() gives at bf16.
inline void round_matrices(Model& m) {
    for (const TensorSpec& t : with_storage(model_tensors(m), DType::bf16))
        if (t.dtype == DType::bf16 && t.dest->view().dtype == DType::f32)
            for (float *v = t.dest->ptr<float>(), *end = v + t.dest->view().numel(); v != end; ++v)
                *v = bf16_to_float(float_to_bf16(*v));
}

// A pass with bf16 matrices against its fp32 twin (round_matrices) where each product rounds its
// fp32 input to bf16 (the GPU always; the CPU's AVX-512-BF16 kernels mostly): relative error ≤
// u = 2^-9 an element. A tiny preset's longest path crosses 4 layers of 2 chained products in the
// mixer (a projection, o_proj) and 2 in the FFN (up/gate, down), then the head: k = 17 rounded
// products forward, as many again backward. Uncorrelated roundings grow as √k·u; the bounds are
// 3√k·u: the loss (k = 17) relative to itself, 0.024; the adapter gradients (k = 34) relative to
// the largest, 0.034. A discrete choice that the rounding switches (a token's experts, seen as a
// different expert load; tiny-deepseek's DSA top-k and routing, which switch for two_docs on the
// CPU's bf16 kernels) moves whole gradients: then kBf16Switched, bf16_model's bound for a bf16
// base against its twin.
inline const double kBf16Loss = 3 * std::sqrt(17.0) * std::ldexp(1.0, -9);
inline const double kBf16Grad = 3 * std::sqrt(34.0) * std::ldexp(1.0, -9);
inline const double kBf16Switched = 0.25;
inline double bf16_grad_bound(const std::string& preset, bool same_expert_load) {
    return preset != "tiny-deepseek" && same_expert_load ? kBf16Grad : kBf16Switched;
}

// [n_layer][E] zeros: TrainOptions::expert_load's counters for m.
inline std::vector<std::vector<int64_t>> no_load(const Model& m) {
    return std::vector<std::vector<int64_t>>(
        m.cfg.layers.size(),
        std::vector<int64_t>(static_cast<size_t>(m.cfg.moe.n_routed_experts), 0));
}

// max |got − want| / max |want|
inline double max_abs_rel(const std::vector<float>& got, const std::vector<float>& want) {
    double diff = 0, scale = 0;
    for (size_t i = 0; i < want.size(); ++i) {
        diff = std::max(diff, static_cast<double>(std::abs(got[i] - want[i])));
        scale = std::max(scale, static_cast<double>(std::abs(want[i])));
    }
    return diff / scale;
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
