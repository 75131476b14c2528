// The model on a device (model/device_model.h) made on the CPU for a rank's part of the model, cut
// over the world's N ranks: its logits over a plan of steps on two sequences (a prefill with every
// row's logits, three decodes with the last rows', a step with no rows) bit for bit the CPU
// forward of the same part (model::forward over the same grid; ep_overlap off, as there), so the
// device model's hand-over between stages, its tp collectives and vocabulary-parallel embedding and
// head, and its expert dispatch over ep run the host code the GPU runs
// (tests/mpi/test_cuda_layouts.cpp and test_cuda_ep.cpp hold those to the one-rank CPU on a GPU).
//   pp = N: presets tiny and tiny-deepseek, a layer or more a stage; only the last stage returns
//     logits.
//   tp = min(N, 4) (the tiny presets' 4 heads), dp the rest: the same presets, heads, widths and
//     the vocabulary split.
//   ep = N (dp = N): tiny-deepseek and tiny-kimi, the routed experts spread over the ranks; also
//     with DeviceModelOptions::ep_overlap (two micro-batches), within 1e-6 relative; and after
//     two experts swapped between ranks and after every MoE layer's experts moved one ep rank on
//     (DeviceModel::place_experts), the arriving ones drawn from another seed.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "../testing.h"
#include "hymoe/model/config.h"
#include "hymoe/model/device_model.h"
#include "hymoe/model/eplb.h"
#include "hymoe/model/model.h"
#include "hymoe/parallel/comms.h"
#include "step_plan.h"

namespace {

using namespace hymoe;
using cuda_test::kLayoutPlan;
using cuda_test::plan_tokens;
using cuda_test::run_plan;
using hymoe::testing::all_ranks;
using hymoe::testing::world_size;

model::DeviceModelOptions on_cpu(bool ep_overlap) {
    model::DeviceModelOptions o;
    o.device = Device::cpu;
    o.ep_overlap = ep_overlap;
    o.dtype = DType::f32;
    o.max_tokens = 64;
    o.max_seqs = 4;
    o.arena_bytes = size_t{64} << 20;
    return o;
}

// Elements of a step's logits (0: none, as a stage before the last returns).
int64_t count(const Buffer& b) {
    return b.view().data == nullptr ? 0 : b.view().numel();
}

bool bit_equal(const std::vector<Buffer>& a, const std::vector<Buffer>& b) {
    if (a.size() != b.size())
        return false;
    for (size_t k = 0; k < a.size(); ++k) {
        const Tensor& x = a[k].view();
        const Tensor& y = b[k].view();
        if (count(a[k]) != count(b[k]))
            return false;
        if (count(a[k]) == 0)
            continue;
        for (int64_t i = 0; i < x.numel(); ++i)
            if (x.ptr<float>()[i] != y.ptr<float>()[i])
                return false;
    }
    return true;
}

// The device model of the rank's part against the CPU forward of that part, for each preset.
void check_layout(const parallel::Layout& layout, const std::vector<std::string>& presets) {
    parallel::Grid grid = parallel::make_grid(layout);
    const std::vector<std::vector<int64_t>> seqs = plan_tokens(41);
    for (const std::string& name : presets) {
        model::ModelConfig cfg = model::preset_config(name);
        while (static_cast<int>(cfg.layers.size()) < layout.pp)  // a layer or more a stage
            cfg.layers.push_back(cfg.layers.back());
        model::Model part = model::make_model(cfg, grid);
        model::init_model_random(part, 7);
        const auto device = model::make_device_model(part, on_cpu(false));
        const std::vector<Buffer> got = run_plan(part, device.get(), kLayoutPlan, seqs);
        const std::vector<Buffer> want = run_plan(part, nullptr, kLayoutPlan, seqs);
        BOOST_TEST_INFO(name);
        BOOST_TEST(all_ranks(bit_equal(got, want)));
        if (layout.ep > 1) {  // the rows in two micro-batches: the experts' products over other
                              // row counts round otherwise (about 1e-7)
            const auto overlap = model::make_device_model(part, on_cpu(true));
            const double err =
                cuda_test::rel_error(run_plan(part, overlap.get(), kLayoutPlan, seqs), want);
            BOOST_TEST_INFO(name << " in two micro-batches: " << err);
            BOOST_TEST(all_ranks(err <= 1e-6));
        }
        if (part.shard.last_stage())
            BOOST_TEST(count(got[0]) == 30 * cfg.vocab_size);
    }
}

}  // namespace

BOOST_AUTO_TEST_SUITE(device_model_layouts)

BOOST_AUTO_TEST_CASE(pp_stages_equal_the_cpu_forward) {
    check_layout(parallel::Layout{1, 1, world_size(), 1, 1}, {"tiny", "tiny-deepseek"});
}

BOOST_AUTO_TEST_CASE(tp_parts_equal_the_cpu_forward) {
    const int n = world_size(), tp = std::min(n, 4);
    check_layout(parallel::Layout{tp, n / tp, 1, 1, 1}, {"tiny", "tiny-deepseek"});
}

BOOST_AUTO_TEST_CASE(ep_shards_equal_the_cpu_forward) {
    const int n = world_size();
    check_layout(parallel::Layout{1, n, 1, n, 1}, {"tiny-deepseek", "tiny-kimi"});
}

// Expert rebalancing (model::place_experts on the host part, then DeviceModel::place_experts),
// the arriving experts filled from another seed, so that a device model still holding the old
// ones would give other logits: first two experts swapped between ranks 0 and 1 (the other slots
// keep theirs), then every MoE layer's experts shifted one ep rank on.
BOOST_AUTO_TEST_CASE(moved_experts_follow_on_the_device) {
    const int n = world_size();
    parallel::Grid grid = parallel::make_grid(parallel::Layout{1, n, 1, n, 1});
    const std::vector<std::vector<int64_t>> seqs = plan_tokens(41);
    for (const std::string name : {"tiny-deepseek", "tiny"}) {
        model::Model part = model::make_model(model::preset_config(name), grid);
        model::init_model_random(part, 7);
        const auto device = model::make_device_model(part, on_cpu(false));
        const int64_t E = part.cfg.moe.n_routed_experts, per_rank = E / n;
        std::vector<int> swapped(static_cast<size_t>(E)), shifted(static_cast<size_t>(E));
        for (int64_t e = 0; e < E; ++e) {
            swapped[static_cast<size_t>(e)] = static_cast<int>(e / per_rank);
            shifted[static_cast<size_t>(e)] = static_cast<int>((e / per_rank + 1) % n);
        }
        if (n > 1)  // the last of rank 0 and the first of rank 1
            std::swap(swapped[static_cast<size_t>(per_rank - 1)],
                      swapped[static_cast<size_t>(per_rank)]);
        for (const bool swap : {true, false}) {
            const std::vector<int>& placement = swap ? swapped : shifted;
            int moved = 0;
            for (int i = part.shard.first_layer; i < part.shard.end_layer; ++i)
                if (part.cfg.layers[i].ffn != model::Ffn::dense) {
                    moved +=
                        model::place_experts(part, i, placement, [&](const model::TensorList& l) {
                            model::init_tensors_random(l, part.shard, 99);
                        });
                    device->place_experts(part, i);
                }
            BOOST_TEST(!all_ranks(moved == 0) == (n > 1));  // some rank received experts
            BOOST_TEST_INFO(name);
            BOOST_TEST(all_ranks(bit_equal(run_plan(part, device.get(), kLayoutPlan, seqs),
                                           run_plan(part, nullptr, kLayoutPlan, seqs))));
        }
    }
}

BOOST_AUTO_TEST_SUITE_END()
