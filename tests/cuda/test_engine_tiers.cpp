// The engine on the GPU model with the features whose host side lives in the runtime (label
// cuda; each test is a one-line skip without a GPU), against the CPU engine with the same
// feature on, fp32 matrices, model tiny (KDA, DSA, MoE): greedy tokens equal, logprobs within
// 2e-5 (tests/cuda/test_model.cpp's engine bound).
//   - prefix cache (runtime/prefix_cache.h): 12 requests sharing a 24-token system prompt, two
//     sequences at a time; the GPU's KDA snapshots are host copies of its states
//     (DeviceModel::save_kda_states / load_kda_states), and the lookups hit as often as on the
//     CPU (more than once).
//   - the file KV tier (inference.kv_cache.offload: file; DeviceModel::file_kv_store): the host
//     tier's slots over a spill file (runtime/kv_spill.h make_spill_file) instead of pinned
//     memory, few pages (preemptions); against the CPU's own spill tier, and bit for bit the
//     GPU's pinned host tier (the same device work; only where the host rows live differs).
//   - batch invariance (inference.batch_invariant: ops::set_batch_invariant, the generic ops
//     without fused kernels or decode graphs, as runtime's cuda_model_options sets them): every
//     request's tokens, logprobs and prompt logprobs bit for bit the same one sequence at a time
//     and four at a time (each prompt prefilled in one call either way); and the tokens and
//     logprobs with the prefix cache on (prefills cut at the cached prefixes) those with it off.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "cuda_test.h"
#include "hymoe/backend/ops.h"
#include "hymoe/core/rng.h"
#include "hymoe/model/device_model.h"
#include "hymoe/model/model.h"
#include "hymoe/runtime/engine.h"
#include "hymoe/runtime/kv_spill.h"

namespace utf = boost::unit_test;
using namespace hymoe;
using namespace hymoe::cuda_test;

namespace {

std::unique_ptr<model::DeviceModel> device_model(const model::Model& m, bool invariant = false) {
    model::DeviceModelOptions o;
    o.dtype = DType::f32;
    o.max_tokens = 256;
    o.max_seqs = 16;
    o.logits_all = invariant;  // the invariance case compares prompt logprobs too
    o.fused = o.graphs = !invariant;
    o.memory_fraction = 0.05;  // a few GB
    return model::make_device_model(m, o);
}

// 12 requests: a shared 24-token system prompt, then 1..12 tokens of their own.
std::vector<runtime::Pending> requests() {
    Philox rng(23, 0, 0);
    std::vector<int64_t> system;
    for (int t = 0; t < 24; ++t)
        system.push_back(3 + rng.next_u32() % 253);
    std::vector<runtime::Pending> reqs(12);
    for (size_t i = 0; i < reqs.size(); ++i) {
        reqs[i].index = static_cast<int64_t>(i);
        reqs[i].req.id = "r" + std::to_string(i);
        reqs[i].req.line = static_cast<int64_t>(i) + 1;
        reqs[i].req.tokens = system;
        const int64_t own = 1 + rng.next_u32() % 12;
        for (int64_t t = 0; t < own; ++t)
            reqs[i].req.tokens.push_back(3 + rng.next_u32() % 253);
    }
    return reqs;
}

// The requests through run_engine (greedy, 6 new tokens each) on the CPU (device null) or the
// GPU, with o adjusted by `setup`; the engine's stats in *stats.
std::vector<runtime::Finished> run_engine(const model::Model& m,
                                          model::DeviceModel* device,
                                          const std::function<void(runtime::EngineOptions&)>& setup,
                                          runtime::EngineStats* stats) {
    runtime::EngineOptions o;
    o.max_seqs = 2, o.max_tokens = 48, o.prefill_chunk = 16;
    o.max_new_tokens = 6, o.progress_every_s = 0, o.seed = 3;
    o.page_tokens = 8, o.kv_pages = 32;
    o.device = device;
    setup(o);
    const std::vector<runtime::Pending> reqs = requests();
    size_t next = 0;
    std::vector<runtime::Finished> out;
    *stats = runtime::run_engine(
        m,
        o,
        [&](runtime::Pending& p) {
            if (next == reqs.size())
                return false;
            p = reqs[next++];
            return true;
        },
        [&](runtime::Finished&& f) { out.push_back(std::move(f)); });
    std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.index < b.index; });
    return out;
}

void expect_close(const std::vector<runtime::Finished>& gpu,
                  const std::vector<runtime::Finished>& cpu) {
    BOOST_REQUIRE_EQUAL(gpu.size(), cpu.size());
    for (size_t i = 0; i < gpu.size(); ++i)
        BOOST_TEST_CONTEXT("request " << cpu[i].index) {
            BOOST_TEST(gpu[i].tokens == cpu[i].tokens, boost::test_tools::per_element());
            BOOST_REQUIRE_EQUAL(gpu[i].logprobs.size(), cpu[i].logprobs.size());
            for (size_t k = 0; k < gpu[i].logprobs.size(); ++k)
                BOOST_TEST(std::abs(gpu[i].logprobs[k] - cpu[i].logprobs[k]) <= 2e-5f);
        }
}

}  // namespace

BOOST_AUTO_TEST_SUITE(cuda_engine_tiers, *utf::label("cuda"))

BOOST_AUTO_TEST_CASE(prefix_cache_matches_the_cpu, *utf::precondition(need_gpu)) {
    model::Model m = model::make_model(model::preset_config("tiny"));
    model::init_model_random(m, 7);
    auto cached = [](runtime::EngineOptions& o) { o.prefix_cache_bytes = int64_t{1} << 30; };
    runtime::EngineStats cpu_stats, gpu_stats;
    const std::vector<runtime::Finished> cpu = run_engine(m, nullptr, cached, &cpu_stats);
    const auto dm = device_model(m);
    const std::vector<runtime::Finished> gpu = run_engine(m, dm.get(), cached, &gpu_stats);
    BOOST_TEST_MESSAGE("prefix cache: " << gpu_stats.cache_hits << " hits, "
                                        << gpu_stats.cached_tokens << " tokens restored");
    BOOST_TEST(cpu_stats.cache_hits > 1);
    BOOST_TEST(gpu_stats.cache_hits == cpu_stats.cache_hits);
    BOOST_TEST(gpu_stats.cached_tokens == cpu_stats.cached_tokens);
    expect_close(gpu, cpu);
}

BOOST_AUTO_TEST_CASE(file_tier_matches_the_cpu, *utf::precondition(need_gpu)) {
    model::Model m = model::make_model(model::preset_config("tiny"));
    model::init_model_random(m, 7);
    const std::string dir = std::filesystem::temp_directory_path().string();
    runtime::EngineStats stats;
    const std::vector<runtime::Finished> cpu = run_engine(
        m,
        nullptr,
        [&](runtime::EngineOptions& o) {
            o.kv_pages = 10;
            o.kv_store = [&](const model::KvLayout& l) {
                return std::make_unique<runtime::SpillKvStore>(l, dir, "k");
            };
        },
        &stats);
    const auto dm = device_model(m);
    model::DeviceModel* d = dm.get();
    const std::vector<runtime::Finished> file = run_engine(
        m,
        d,
        [&](runtime::EngineOptions& o) {
            o.kv_pages = 10;
            o.kv_store = [&](const model::KvLayout& l) {
                return d->file_kv_store(
                    l, runtime::make_spill_file(dir, "k", runtime::spill_file_bytes(l)));
            };
        },
        &stats);
    BOOST_TEST_MESSAGE("file tier: " << stats.preemptions << " preemptions");
    BOOST_TEST(stats.preemptions > 0);
    expect_close(file, cpu);
    const std::vector<runtime::Finished> host = run_engine(
        m,
        d,
        [&](runtime::EngineOptions& o) {
            o.kv_pages = 10;
            o.kv_store = [&](const model::KvLayout& l) { return d->host_kv_store(l); };
        },
        &stats);
    BOOST_REQUIRE_EQUAL(file.size(), host.size());
    for (size_t i = 0; i < file.size(); ++i) {
        BOOST_TEST(file[i].tokens == host[i].tokens, boost::test_tools::per_element());
        BOOST_TEST(file[i].logprobs == host[i].logprobs, boost::test_tools::per_element());
    }
}

BOOST_AUTO_TEST_CASE(batch_invariant_results_do_not_depend_on_the_batch,
                     *utf::precondition(need_gpu)) {
    model::Model m = model::make_model(model::preset_config("tiny"));
    model::init_model_random(m, 7);
    ops::set_batch_invariant(true);
    const auto dm = device_model(m, true);
    auto seqs = [](int n) {
        return [n](runtime::EngineOptions& o) {
            o.max_seqs = n, o.max_tokens = 256, o.prefill_chunk = 64, o.kv_pages = 64;
            o.prompt_logprobs = true;
        };
    };
    runtime::EngineStats stats;
    const std::vector<runtime::Finished> one = run_engine(m, dm.get(), seqs(1), &stats);
    const std::vector<runtime::Finished> four = run_engine(m, dm.get(), seqs(4), &stats);
    auto cache = [](bool on) {
        return
            [on](runtime::EngineOptions& o) { o.prefix_cache_bytes = on ? int64_t{1} << 30 : 0; };
    };
    const std::vector<runtime::Finished> uncached = run_engine(m, dm.get(), cache(false), &stats);
    const std::vector<runtime::Finished> cached = run_engine(m, dm.get(), cache(true), &stats);
    ops::set_batch_invariant(false);
    BOOST_TEST(stats.cache_hits > 1);
    BOOST_REQUIRE_EQUAL(cached.size(), uncached.size());
    for (size_t i = 0; i < cached.size(); ++i)
        BOOST_TEST_CONTEXT("request " << cached[i].index << " with the prefix cache") {
            BOOST_TEST(cached[i].tokens == uncached[i].tokens, boost::test_tools::per_element());
            BOOST_TEST(cached[i].logprobs == uncached[i].logprobs,
                       boost::test_tools::per_element());
        }
    BOOST_REQUIRE_EQUAL(one.size(), four.size());
    for (size_t i = 0; i < one.size(); ++i)
        BOOST_TEST_CONTEXT("request " << one[i].index) {
            BOOST_TEST(four[i].tokens == one[i].tokens, boost::test_tools::per_element());
            BOOST_TEST(four[i].logprobs == one[i].logprobs, boost::test_tools::per_element());
            BOOST_TEST(four[i].prompt_logprobs == one[i].prompt_logprobs,
                       boost::test_tools::per_element());
        }
}

BOOST_AUTO_TEST_SUITE_END()
