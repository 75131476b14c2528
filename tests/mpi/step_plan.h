// A plan of forward steps over a few sequences, run on the CPU model or on a model on a device
// (DeviceModel), for the multi-rank tests (test_cuda_ep.cpp, test_cuda_layouts.cpp,
// test_device_model_layouts.cpp): the layout tests' plan and tokens, each step's logits (every
// row's on the first step, the last rows' after; recurrent KDA and absorbed attention, the GPU's
// forms), and the relative error between two runs.
#pragma once

#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "../cuda/paged_sequences.h"
#include "hymoe/core/rng.h"
#include "hymoe/model/device_model.h"
#include "hymoe/model/model.h"

namespace hymoe::cuda_test {

// One step: each sequence's (first token, count); empty: no rows this step.
using StepRows = std::vector<std::pair<int64_t, int64_t>>;

// A prefill with every row's logits, three decodes with the last rows', one with no rows between
// (the layout tests' plan over two sequences).
inline const std::vector<StepRows> kLayoutPlan = {
    {{0, 11}, {0, 19}}, {{11, 1}, {19, 1}}, {{12, 1}, {20, 1}}, {}, {{13, 1}, {21, 1}}};

// Two sequences' tokens (ids 3..255) drawn from seed, long enough for kLayoutPlan; the same on
// every rank.
inline std::vector<std::vector<int64_t>> plan_tokens(uint64_t seed) {
    Philox rng(seed, 0, 0);
    std::vector<std::vector<int64_t>> t(2);
    for (auto& seq : t)
        for (int i = 0; i < 32; ++i)
            seq.push_back(3 + rng.next_u32() % 253);
    return t;
}

constexpr int kPlanPageTokens = 8;
constexpr int64_t kPlanPages = 64;

// Every step's logits of `plan` over the sequences `seqs` (their tokens) on the CPU (device
// null: m on this rank alone) or on the GPU model made from m (empty where it returns none);
// seq_adapter (empty: none) gives each sequence's LoRA adapter (SeqBatch::adapter).
inline std::vector<Buffer> run_plan(const model::Model& m,
                                    model::DeviceModel* device,
                                    const std::vector<StepRows>& plan,
                                    const std::vector<std::vector<int64_t>>& seqs,
                                    const std::vector<int>& seq_adapter = {}) {
    PagedSequences paged = paged_sequences(m, device, kPlanPageTokens, kPlanPages, seqs.size());
    std::vector<Buffer> out;
    for (size_t k = 0; k < plan.size(); ++k) {
        std::vector<int64_t> tokens;
        model::SeqBatch batch{{0}, {}, {}};
        std::vector<model::SequenceState*> ptrs;
        for (size_t s = 0; s < plan[k].size(); ++s) {
            const auto [begin, count] = plan[k][s];
            BOOST_REQUIRE(paged.pool->reserve(paged.states[s].pages, begin + count));
            tokens.insert(tokens.end(), seqs[s].begin() + begin, seqs[s].begin() + begin + count);
            batch.pos0.push_back(begin);
            batch.offsets.push_back(static_cast<int64_t>(tokens.size()));
            if (!seq_adapter.empty())
                batch.adapter.push_back(seq_adapter[s]);
            ptrs.push_back(&paged.states[s]);
        }
        model::ForwardOptions fo;
        fo.logits = k == 0 ? model::Logits::all : model::Logits::last;
        fo.kda_mode = model::KdaMode::recurrent;
        fo.attn_mode = model::AttnMode::absorbed;
        Buffer logits;
        if (device)
            device->forward(tokens, batch, ptrs, logits, fo, nullptr);
        else if (!tokens.empty())
            model::forward(m, tokens, batch, ptrs, logits, fo);
        else
            logits = Buffer(DType::f32, {0, m.cfg.vocab_size});
        out.push_back(std::move(logits));
    }
    return out;
}

// ‖a − b‖ / ‖b‖ over every step (infinite when a step's sizes differ; 0 when both are empty).
inline double rel_error(const std::vector<Buffer>& a, const std::vector<Buffer>& b) {
    double diff = 0, norm = 0;
    for (size_t k = 0; k < a.size(); ++k) {
        const int64_t n = a[k].view().numel();
        if (n != b[k].view().numel())
            return INFINITY;
        for (int64_t i = 0; i < n; ++i) {
            const double got = a[k].ptr<float>()[i], want = b[k].ptr<float>()[i];
            diff += (got - want) * (got - want);
            norm += want * want;
        }
    }
    return norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

}  // namespace hymoe::cuda_test
