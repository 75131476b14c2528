// The GPU forward cut over ranks (CUDA builds; mpirun -np N with N ≥ 2 ranks that each see a
// GPU, else one skip line a suite): each rank the GPU model of its part, the last stage's logits
// over a plan of steps on two sequences (a prefill with every row's logits, three decodes with
// the last rows', a step with no rows) against the one-rank CPU forward of the whole model on the
// same tokens (recurrent KDA, absorbed attention: the GPU's forms), fp32 matrices, relative error
// ≤ 1e-5.
//   cuda_pp: pp = N (tp = dp = ep = 1), presets tiny (KDA + MLA, MoE) and tiny-deepseek (DSA/MLA,
//     MoE with shared experts); the stages hand the residual stream over through MPI, so one GPU
//     shared is enough; the other stages return no logits.
//   cuda_tp: tp = N, the same presets: heads and widths split, the partial outputs summed over tp
//     by comm:: (NCCL, or through the host where the ranks share a GPU), each MoE layer's rows
//     owned by one rank of the group (model/moe_parallel.h).
#ifdef HYMOE_CUDA

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "../cuda/paged_sequences.h"
#include "../testing.h"
#include "hymoe/core/rng.h"
#include "hymoe/model/config.h"
#include "hymoe/model/cuda_model.h"
#include "hymoe/model/kv_cache.h"
#include "hymoe/model/model.h"
#include "hymoe/parallel/comms.h"
#include "hymoe/parallel/device_select.h"

namespace {

using namespace hymoe;
using hymoe::testing::all_ranks;
using hymoe::testing::world_size;

constexpr int kPageTokens = 8;
constexpr int64_t kPages = 64;

// One step: each sequence's (first token, count); empty: no rows this step.
using StepRows = std::vector<std::pair<int64_t, int64_t>>;

const std::vector<StepRows> kPlan = {
    {{0, 11}, {0, 19}}, {{11, 1}, {19, 1}}, {{12, 1}, {20, 1}}, {}, {{13, 1}, {21, 1}}};

// Two sequences' tokens (ids 3..255), long enough for the plan; the same on every rank.
std::vector<std::vector<int64_t>> plan_tokens() {
    Philox rng(37, 0, 0);
    std::vector<std::vector<int64_t>> t(2);
    for (auto& seq : t)
        for (int i = 0; i < 32; ++i)
            seq.push_back(3 + rng.next_u32() % 253);
    return t;
}

// Every step's logits of the plan on the CPU (device null: m whole, one rank) or on m's stage
// of the GPU model (empty on every stage but the last).
std::vector<Buffer> run(const model::Model& m,
                        model::DeviceModel* device,
                        const std::vector<std::vector<int64_t>>& seqs) {
    cuda_test::PagedSequences paged =
        cuda_test::paged_sequences(m, device, kPageTokens, kPages, seqs.size());
    std::vector<Buffer> out;
    for (size_t k = 0; k < kPlan.size(); ++k) {
        std::vector<int64_t> tokens;
        model::SeqBatch batch{{0}, {}, {}};
        std::vector<model::SequenceState*> ptrs;
        for (size_t s = 0; s < kPlan[k].size(); ++s) {
            const auto [begin, count] = kPlan[k][s];
            BOOST_REQUIRE(paged.pool->reserve(paged.states[s].pages, begin + count));
            tokens.insert(tokens.end(), seqs[s].begin() + begin, seqs[s].begin() + begin + count);
            batch.pos0.push_back(begin);
            batch.offsets.push_back(static_cast<int64_t>(tokens.size()));
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

// ‖a − b‖ / ‖b‖ over every step (infinite when a step's sizes differ).
double rel_error(const std::vector<Buffer>& a, const std::vector<Buffer>& b) {
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

bool every_rank_has_a_gpu() {
    const backend::DeviceInfo d = parallel::select_device(true);
    return all_ranks(world_size() >= 2 && d.cuda_available);
}

}  // namespace

// The options of a model on a GPU that N ranks may share.
model::CudaModelOptions options(int n) {
    model::CudaModelOptions o;
    o.dtype = DType::f32;
    o.max_tokens = 256;
    o.max_seqs = 16;
    o.logits_all = true;
    o.memory_fraction = 0.3 / n;
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
    const std::vector<std::vector<int64_t>> seqs = plan_tokens();
    for (const std::string name : {"tiny", "tiny-deepseek"}) {
        model::ModelConfig cfg = model::preset_config(name);
        while (static_cast<int>(cfg.layers.size()) < n)  // a layer or more a stage
            cfg.layers.push_back(cfg.layers.back());
        model::Model whole = model::make_model(cfg);
        model::init_model_random(whole, 7);
        model::Model stage = model::make_model(cfg, grid);  // its layers only
        model::init_model_random(stage, 7);
        const auto device = model::make_cuda_model(stage, options(n));
        const std::vector<Buffer> gpu = run(stage, device.get(), seqs);
        if (!stage.shard.last_stage()) {
            for (const Buffer& b : gpu)
                BOOST_TEST(b.view().numel() == 0);
            BOOST_TEST(all_ranks(true));
            continue;
        }
        const double err = rel_error(gpu, run(whole, nullptr, seqs));
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
    const std::vector<std::vector<int64_t>> seqs = plan_tokens();
    for (const std::string name : {"tiny", "tiny-deepseek"}) {
        const model::ModelConfig cfg = model::preset_config(name);
        model::Model whole = model::make_model(cfg);
        model::init_model_random(whole, 7);
        model::Model part = model::make_model(cfg, grid);  // its heads, widths and V/tp rows
        model::init_model_random(part, 7);
        const auto device = model::make_cuda_model(part, options(n));
        const double err = rel_error(run(part, device.get(), seqs), run(whole, nullptr, seqs));
        BOOST_TEST_MESSAGE("cuda_tp " << name << " rank " << grid.me.tp << ": "
                                      << device->describe() << ", logits rel. error " << err);
        BOOST_TEST_INFO(name << ": " << err);
        BOOST_TEST(all_ranks(err <= 1e-5));
    }
}

BOOST_AUTO_TEST_SUITE_END()

#endif  // HYMOE_CUDA
