// The GPU forward with the routed experts split over an ep group (CUDA builds; mpirun -np N with
// N ≥ 2 ranks that each see a GPU, which they may share: comm:: then stages the exchanges through
// host memory; else one skip line): tp = pp = 1, dp = ep = N, each rank its own
// requests, attention/KDA/dense weights whole and E/N experts a rank. Each rank's logits over a
// plan of steps (prefill of two sequences with every row's logits, decodes, and a step in which
// the odd ranks have no rows but still join every MoE layer's exchange) against the one-rank CPU
// forward of the whole model on the same tokens (recurrent KDA, absorbed attention: the GPU's
// forms), fp32 matrices, relative error ≤ 1e-5, with the two-micro-batch overlap off and on;
// presets tiny (KDA + MLA, MoE) and tiny-deepseek (DSA/MLA, MoE with shared experts). With bf16
// matrices (tiny, overlap on: its MoE layers route on the device's fused kernel), against the
// one-rank GPU model of the whole model on the same tokens within 1e-2 relative (the same kernels
// but for the experts' GEMM batches and the combine's regrouping, which may flip a near-tied
// routing choice). With LoRA adapters (tiny-deepseek, fp32, overlap off and on): two adapters of
// rank 4 on every target, each routed expert its own, B drawn per factor from its name (so the
// part and the whole model hold the same factors), the two sequences on adapters 1 and 0; the
// ep logits against the one-rank CPU forward with the same adapters (1e-5), and not the base
// model's (the adapters move them by more than 1e-3); with every sequence on the base model (-1),
// the base model's logits (1e-5).
#ifdef HYMOE_CUDA

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "../testing.h"
#include "hymoe/core/rng.h"
#include "hymoe/model/config.h"
#include "hymoe/model/device_model.h"
#include "hymoe/model/kv_cache.h"
#include "hymoe/model/lora_model.h"
#include "hymoe/model/model.h"
#include "hymoe/parallel/comms.h"
#include "hymoe/parallel/device_select.h"
#include "step_plan.h"

namespace {

using namespace hymoe;
using cuda_test::rel_error;
using cuda_test::run_plan;
using cuda_test::StepRows;
using hymoe::testing::all_ranks;
using hymoe::testing::world_size;

// Rank r's plan over two sequences of prompt lengths 9 + 4r and 17 + r: the prefill (every row's
// logits), three decodes (last rows), a step the odd ranks sit out, and one more decode.
std::vector<StepRows> plan_of(int rank) {
    const int64_t a = 9 + 4 * rank, b = 17 + rank;
    std::vector<StepRows> plan = {{{0, a}, {0, b}}};
    for (int64_t k = 0; k < 3; ++k)
        plan.push_back({{a + k, 1}, {b + k, 1}});
    plan.push_back(rank % 2 ? StepRows{} : StepRows{{a + 3, 1}, {b + 3, 1}});
    const int64_t extra = rank % 2 ? 3 : 4;
    plan.push_back({{a + extra, 1}, {b + extra, 1}});
    return plan;
}

// The tokens of rank r's two sequences (ids 3..255), long enough for its plan.
std::vector<std::vector<int64_t>> tokens_of(int rank) {
    Philox rng(31, static_cast<uint32_t>(rank), 0);
    std::vector<std::vector<int64_t>> t(2);
    for (auto& seq : t)
        for (int i = 0; i < 40; ++i)
            seq.push_back(3 + rng.next_u32() % 253);
    return t;
}

model::DeviceModelOptions options(DType dtype, bool overlap) {
    model::DeviceModelOptions o;
    o.dtype = dtype;
    o.max_tokens = 256;
    o.max_seqs = 16;
    o.logits_all = true;
    o.memory_fraction = 0.05;  // a few GB: the test holds two models
    o.ep_overlap = overlap;
    return o;
}

// Every rank on a GPU, its own or shared (comm:: stages a shared GPU's collectives through host
// memory, as NCCL refuses two ranks of one communicator on one device).
bool every_rank_has_a_gpu() {
    const backend::DeviceInfo d = parallel::select_device(true);
    return all_ranks(world_size() >= 2 && d.cuda_available);
}

// m with two adapters of rank 4 (scales 0.5, 1.5) on every target, each routed expert its own;
// every B drawn from a stream keyed by its name, so that a rank's part holds the whole model's
// factors of its experts. Held in place: m's blocks point at its slots.
struct WithAdapters {
    model::LoraModel lm;
    explicit WithAdapters(model::Model& m) {
        lm = model::attach_lora(m,
                                {"q_proj",
                                 "k_proj",
                                 "v_proj",
                                 "o_proj",
                                 "gate_proj",
                                 "up_proj",
                                 "down_proj",
                                 "experts",
                                 "shared_experts"},
                                true);
        for (int id = 0; id < 2; ++id) {
            model::add_lora_adapter(lm, m.shard, 4, 0.5f + static_cast<float>(id), 10 + id, false);
            for (const model::TensorSpec& t : lm.tensors(id))
                if (t.name.find("lora_B") != std::string::npos) {
                    Philox rng(std::hash<std::string>{}(t.name), static_cast<uint32_t>(id), 0);
                    rng.fill_normal(
                        t.dest->ptr<float>(), static_cast<size_t>(shape_numel(t.shape)), 0, 0.2f);
                }
        }
    }
};

}  // namespace

BOOST_AUTO_TEST_SUITE(cuda_ep)

BOOST_AUTO_TEST_CASE(ep_forward_matches_the_one_rank_cpu) {
    if (!every_rank_has_a_gpu()) {
        BOOST_TEST_MESSAGE("cuda_ep: skipped (needs at least 2 ranks that each see a GPU)");
        return;
    }
    const int n = world_size();
    parallel::Grid grid = parallel::make_grid(parallel::Layout{1, n, 1, n, 1});
    const int rank = grid.me.dp;
    const std::vector<StepRows> plan = plan_of(rank);
    const std::vector<std::vector<int64_t>> seqs = tokens_of(rank);
    for (const std::string name : {"tiny", "tiny-deepseek"}) {
        const model::ModelConfig cfg = model::preset_config(name);
        model::Model whole = model::make_model(cfg);
        model::init_model_random(whole, 7);
        model::Model part = model::make_model(cfg, grid);  // its hosted experts only
        model::init_model_random(part, 7);
        const std::vector<Buffer> cpu = run_plan(whole, nullptr, plan, seqs);
        for (bool overlap : {false, true}) {
            const auto device = model::make_device_model(part, options(DType::f32, overlap));
            const std::vector<Buffer> gpu = run_plan(part, device.get(), plan, seqs);
            const double err = rel_error(gpu, cpu);
            BOOST_TEST_MESSAGE("cuda_ep " << name << " rank " << rank << (overlap ? " overlap" : "")
                                          << ": " << device->describe() << ", logits rel. error "
                                          << err);
            BOOST_TEST_INFO(name << (overlap ? " overlap" : "") << " rank " << rank << ": " << err);
            BOOST_TEST(all_ranks(err <= 1e-5));
        }
    }
}

BOOST_AUTO_TEST_CASE(bf16_ep_forward_is_close_to_the_one_rank_gpu) {
    if (!every_rank_has_a_gpu()) {
        BOOST_TEST_MESSAGE("cuda_ep: skipped (needs at least 2 ranks that each see a GPU)");
        return;
    }
    const int n = world_size();
    parallel::Grid grid = parallel::make_grid(parallel::Layout{1, n, 1, n, 1});
    const std::vector<StepRows> plan = plan_of(grid.me.dp);
    const std::vector<std::vector<int64_t>> seqs = tokens_of(grid.me.dp);
    const model::ModelConfig cfg = model::preset_config("tiny");
    model::Model whole = model::make_model(cfg);
    model::init_model_random(whole, 7);
    model::Model part = model::make_model(cfg, grid);
    model::init_model_random(part, 7);
    std::vector<Buffer> one;
    {
        const auto device = model::make_device_model(whole, options(DType::bf16, false));
        one = run_plan(whole, device.get(), plan, seqs);
    }
    const auto device = model::make_device_model(part, options(DType::bf16, true));
    const double err = rel_error(run_plan(part, device.get(), plan, seqs), one);
    BOOST_TEST_MESSAGE("cuda_ep tiny bf16 rank " << grid.me.dp << ": logits rel. error " << err);
    BOOST_TEST(all_ranks(err <= 1e-2));
}

BOOST_AUTO_TEST_CASE(ep_forward_with_adapters_matches_the_one_rank_cpu) {
    if (!every_rank_has_a_gpu()) {
        BOOST_TEST_MESSAGE("cuda_ep: skipped (needs at least 2 ranks that each see a GPU)");
        return;
    }
    const int n = world_size();
    parallel::Grid grid = parallel::make_grid(parallel::Layout{1, n, 1, n, 1});
    const int rank = grid.me.dp;
    const std::vector<StepRows> plan = plan_of(rank);
    const std::vector<std::vector<int64_t>> seqs = tokens_of(rank);
    const std::vector<int> adapters = {1, 0};
    const model::ModelConfig cfg = model::preset_config("tiny-deepseek");
    model::Model whole = model::make_model(cfg);
    model::init_model_random(whole, 7);
    const std::vector<Buffer> base = run_plan(whole, nullptr, plan, seqs);
    const WithAdapters whole_lora(whole);
    model::Model part = model::make_model(cfg, grid);
    model::init_model_random(part, 7);
    const WithAdapters part_lora(part);
    const std::vector<Buffer> cpu = run_plan(whole, nullptr, plan, seqs, adapters);
    const double moved = rel_error(cpu, base);
    BOOST_TEST_INFO("adapters move the CPU's logits by " << moved);
    BOOST_TEST(all_ranks(moved > 1e-3));
    for (bool overlap : {false, true}) {
        const auto device = model::make_device_model(part, options(DType::f32, overlap));
        device->set_lora_adapters(part);
        const double err = rel_error(run_plan(part, device.get(), plan, seqs, adapters), cpu);
        BOOST_TEST_MESSAGE("cuda_ep tiny-deepseek with adapters rank "
                           << rank << (overlap ? " overlap" : "") << ": logits rel. error " << err);
        BOOST_TEST_INFO((overlap ? "overlap" : "no overlap") << " rank " << rank << ": " << err);
        BOOST_TEST(all_ranks(err <= 1e-5));
        // steps none of whose rows uses an adapter: the base model's logits
        const double base_err = rel_error(run_plan(part, device.get(), plan, seqs, {-1, -1}), base);
        BOOST_TEST_INFO("base rows, rank " << rank << ": " << base_err);
        BOOST_TEST(all_ranks(base_err <= 1e-5));
    }
}

BOOST_AUTO_TEST_SUITE_END()

#endif  // HYMOE_CUDA
