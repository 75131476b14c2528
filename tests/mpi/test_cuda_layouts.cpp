// The GPU forward cut over ranks (CUDA builds; mpirun -np N with N ≥ 2 ranks that each see a
// GPU, else one skip line a suite): each rank the GPU model of its part, the last stage's logits
// over a plan of steps on two sequences (a prefill with every row's logits, three decodes with
// the last rows', a step with no rows) against the one-rank CPU forward of the whole model on the
// same tokens (recurrent KDA, absorbed attention: the GPU's forms), fp32 matrices, relative error
// ≤ 1e-5. Each rank's arena is its share of 0.3 of the GPU's free memory (parallel::share_device,
// runtime::arena_share: half each where 2 ranks share one GPU), as an infer or lora job's.
//   cuda_pp: pp = N (tp = dp = ep = 1), presets tiny (KDA + MLA, MoE) and tiny-deepseek (DSA/MLA,
//     MoE with shared experts); the stages hand the residual stream over through MPI, so one GPU
//     shared is enough; the other stages return no logits.
//   cuda_tp: tp = N, the same presets: heads and widths split, the partial outputs summed over tp
//     by comm:: (NCCL, or through the host where the ranks share a GPU), each MoE layer's rows
//     owned by one rank of the group (model/moe_parallel.h).
#ifdef HYMOE_CUDA

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "../testing.h"
#include "hymoe/backend/device.h"
#include "hymoe/model/config.h"
#include "hymoe/model/device_model.h"
#include "hymoe/model/kv_cache.h"
#include "hymoe/model/model.h"
#include "hymoe/parallel/comms.h"
#include "hymoe/parallel/device_select.h"
#include "hymoe/parallel/device_share.h"
#include "hymoe/runtime/device_choice.h"
#include "step_plan.h"

namespace {

using namespace hymoe;
using cuda_test::kLayoutPlan;
using cuda_test::plan_tokens;
using cuda_test::rel_error;
using cuda_test::run_plan;
using hymoe::testing::all_ranks;
using hymoe::testing::world_size;

bool every_rank_has_a_gpu() {
    const backend::DeviceInfo d = parallel::select_device(true);
    return all_ranks(world_size() >= 2 && d.cuda_available);
}

}  // namespace

// The options of a model on a GPU that the ranks may share: 0.3 of its free memory split evenly
// among the ranks on it, as a job's device_memory is (collective).
model::DeviceModelOptions options() {
    model::DeviceModelOptions o;
    o.dtype = DType::f32;
    o.max_tokens = 256;
    o.max_seqs = 16;
    o.logits_all = true;
    const parallel::DeviceShare share =
        parallel::share_device(backend::current_device_key(), backend::free_device_bytes);
    o.arena_bytes = runtime::arena_share(share.free_bytes, 0.3, share.sharers);
    return o;
}

BOOST_AUTO_TEST_SUITE(cuda_pp)

BOOST_AUTO_TEST_CASE(pp_forward_matches_the_one_rank_cpu) {
    if (!every_rank_has_a_gpu()) {
        BOOST_TEST_MESSAGE("cuda_pp: skipped (needs at least 2 ranks that each see a GPU)");
        return;
    }
    const int n = world_size();
    parallel::Grid grid = parallel::make_grid(parallel::Layout{1, 1, n, 1, 1});
    const std::vector<std::vector<int64_t>> seqs = plan_tokens(37);
    for (const std::string name : {"tiny", "tiny-deepseek"}) {
        model::ModelConfig cfg = model::preset_config(name);
        while (static_cast<int>(cfg.layers.size()) < n)  // a layer or more a stage
            cfg.layers.push_back(cfg.layers.back());
        model::Model whole = model::make_model(cfg);
        model::init_model_random(whole, 7);
        model::Model stage = model::make_model(cfg, grid);  // its layers only
        model::init_model_random(stage, 7);
        const auto device = model::make_device_model(stage, options());
        const std::vector<Buffer> gpu = run_plan(stage, device.get(), kLayoutPlan, seqs);
        if (!stage.shard.last_stage()) {
            for (const Buffer& b : gpu)
                BOOST_TEST(b.view().numel() == 0);
            BOOST_TEST(all_ranks(true));
            continue;
        }
        const double err = rel_error(gpu, run_plan(whole, nullptr, kLayoutPlan, seqs));
        BOOST_TEST_MESSAGE("cuda_pp " << name << " stage " << grid.me.pp << ": "
                                      << device->describe() << ", logits rel. error " << err);
        BOOST_TEST_INFO(name << ": " << err);
        BOOST_TEST(all_ranks(err <= 1e-5));
    }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(cuda_tp)

BOOST_AUTO_TEST_CASE(tp_forward_matches_the_one_rank_cpu) {
    if (!every_rank_has_a_gpu()) {
        BOOST_TEST_MESSAGE("cuda_tp: skipped (needs at least 2 ranks that each see a GPU)");
        return;
    }
    const int n = world_size();
    parallel::Grid grid = parallel::make_grid(parallel::Layout{n, 1, 1, 1, 1});
    const std::vector<std::vector<int64_t>> seqs = plan_tokens(37);
    for (const std::string name : {"tiny", "tiny-deepseek"}) {
        const model::ModelConfig cfg = model::preset_config(name);
        model::Model whole = model::make_model(cfg);
        model::init_model_random(whole, 7);
        model::Model part = model::make_model(cfg, grid);  // its heads, widths and V/tp rows
        model::init_model_random(part, 7);
        const auto device = model::make_device_model(part, options());
        const double err = rel_error(run_plan(part, device.get(), kLayoutPlan, seqs),
                                     run_plan(whole, nullptr, kLayoutPlan, seqs));
        BOOST_TEST_MESSAGE("cuda_tp " << name << " rank " << grid.me.tp << ": "
                                      << device->describe() << ", logits rel. error " << err);
        BOOST_TEST_INFO(name << ": " << err);
        BOOST_TEST(all_ranks(err <= 1e-5));
    }
}

BOOST_AUTO_TEST_SUITE_END()

#endif  // HYMOE_CUDA
