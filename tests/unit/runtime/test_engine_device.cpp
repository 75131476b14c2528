// The engine's device hooks (EngineOptions::device, model/device_model.h) in every build: a
// DeviceModel that runs the host forward makes the sequences, the pools' stores and every step's
// forward (or, given EngineOptions::kv_store, that factory makes the stores), and the engine's
// results are bit for bit those of the plain engine, with preemptions; so are they when the
// device reduces the last rows to their top tokens (model::TopLogits) for greedy decoding, top-k
// sampling and top logprobs; with requests carrying images, whose tokens the device's vision
// encoder makes; and with the prefix cache, whose KDA snapshots the device saves and restores
// (DeviceModel::save_kda_states, load_kda_states). Then the same runs on the real model on a
// device made on the CPU (make_device_model, Device::cpu: the GPU's host code over uploaded
// weights, its own KV pages and KDA blocks, the last rows reduced by ops::top_logits) give the
// plain engine's results bit for bit.
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <unistd.h>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "hymoe/core/rng.h"
#include "hymoe/model/device_model.h"
#include "hymoe/runtime/engine.h"
#include "hymoe/runtime/sampler.h"

using namespace hymoe;

namespace {

// model::forward behind the DeviceModel interface, counting what the engine asks of it.
class HostDevice final : public model::DeviceModel {
public:
    explicit HostDevice(const model::Model& m) : m_(m) {}
    model::SequenceState new_sequence() override {
        ++sequences;
        return model::make_sequence_state(m_);
    }
    std::unique_ptr<model::KvStore> kv_store(const model::KvLayout& layout) override {
        ++stores;
        return model::make_memory_kv_store(layout);
    }
    int64_t kv_page_budget(int64_t) const override { return 0; }
    std::unique_ptr<model::KvStore> host_kv_store(const model::KvLayout& layout) override {
        ++host_stores;
        return model::make_memory_kv_store(layout);
    }
    int64_t host_kv_page_budget(int64_t, int64_t) const override { return 0; }
    std::unique_ptr<model::KvStore> file_kv_store(const model::KvLayout& layout, int fd) override {
        ::close(fd);  // the host rows stay in memory
        return model::make_memory_kv_store(layout);
    }
    void forward(const std::vector<int64_t>& tokens,
                 const model::SeqBatch& batch,
                 const std::vector<model::SequenceState*>& states,
                 Buffer& logits,
                 const model::ForwardOptions& options,
                 model::TopLogits* top) override {
        ++forwards;
        model::forward(m_, tokens, batch, states, logits, options);
        if (top != nullptr) {
            ++reduced;
            BOOST_TEST((options.logits == model::Logits::last));
            reduce_rows(logits, *top);
            logits = Buffer();
        }
    }
    void encode_images(const std::vector<model::VisionImage>& images,
                       int pool,
                       Tensor& out,
                       model::VisionStats* stats) override {
        ++encodes;
        model::vision_forward(m_.cfg, m_.vision, images, pool, out, stats);
    }
    // the host forward reads the adapters from the model's own slots
    void set_lora_adapters(const model::Model& host) override { BOOST_TEST(&host == &m_); }
    // the sequence's host KDA states, every layer's S and tails in turn, as one buffer
    Buffer save_kda_states(const model::SequenceState& s) override {
        ++saves;
        std::vector<float> all;
        for_each_state(const_cast<model::SequenceState&>(s), [&](Buffer& b) {
            all.insert(all.end(), b.ptr<float>(), b.ptr<float>() + b.view().numel());
        });
        Buffer out(DType::f32, {static_cast<int64_t>(all.size())});
        std::copy(all.begin(), all.end(), out.ptr<float>());
        return out;
    }
    void load_kda_states(const Buffer& saved, model::SequenceState& s) override {
        ++loads;
        int64_t at = 0;
        for_each_state(s, [&](Buffer& b) {
            std::copy(saved.ptr<float>() + at,
                      saved.ptr<float>() + at + b.view().numel(),
                      b.ptr<float>());
            at += b.view().numel();
        });
        BOOST_TEST(at == saved.view().numel());
    }
    std::string describe() const override { return "host"; }
    model::DecodeGraphCounters graph_counters() const override { return {}; }
    void set_graphs(bool) override {}
    void place_experts(const model::Model&, int) override {}  // the host forward reads m's

    int sequences = 0, stores = 0, host_stores = 0, forwards = 0, reduced = 0, encodes = 0;
    int saves = 0, loads = 0;

private:
    template <class F>
    static void for_each_state(model::SequenceState& s, F&& f) {
        for (model::KdaState& k : s.kda)
            for (Buffer* b : {&k.S, &k.q_tail, &k.k_tail, &k.v_tail})
                if (!b->view().shape.empty())
                    f(*b);
    }
    // Each row's top n in the sampler's order, their logits and log Σ e^{x − max} summed as
    // runtime::token_logprob sums (what the GPU model computes, in another order).
    static void reduce_rows(const Buffer& logits, model::TopLogits& top) {
        const int64_t rows = logits.view().dim(0), V = logits.view().dim(1), n = top.n;
        top.tokens.resize(static_cast<size_t>(rows * n));
        top.logits.resize(static_cast<size_t>(rows * n));
        top.log_sum.resize(static_cast<size_t>(rows));
        std::vector<float> unused(static_cast<size_t>(n));
        for (int64_t r = 0; r < rows; ++r) {
            const float* x = logits.ptr<float>() + r * V;
            runtime::top_logprobs(x, V, static_cast<int>(n), &top.tokens[r * n], unused.data());
            for (int64_t i = 0; i < n; ++i)
                top.logits[r * n + i] = x[top.tokens[r * n + i]];
            const double mx = static_cast<double>(top.logits[r * n]);
            double sum = 0;
            for (int64_t j = 0; j < V; ++j)
                sum += std::exp(static_cast<double>(x[j]) - mx);
            top.log_sum[r] = std::log(sum);
        }
    }

    const model::Model& m_;
};

struct Sampling {
    runtime::SamplingParams params;
    int top_logprobs = 0;
    bool prompt_logprobs = true;
};

// with_images: every third request carries one image of 4×4 or 8×4 patches, its placeholder
// tokens after the prompt's first two; no other prompt token is the placeholder id.
std::vector<runtime::Finished> run(const model::Model& m,
                                   model::DeviceModel* device,
                                   const Sampling& sampling = {},
                                   const model::KvStoreFactory& kv_store = {},
                                   bool with_images = false) {
    runtime::EngineOptions o;
    o.max_seqs = 4, o.max_tokens = 32, o.prefill_chunk = 8;
    o.max_new_tokens = 6, o.progress_every_s = 0, o.seed = 3;
    o.page_tokens = 4, o.kv_pages = 14;  // few pages: preemptions
    o.sampling = sampling.params;
    o.top_logprobs = sampling.top_logprobs;
    o.prompt_logprobs = sampling.prompt_logprobs;
    o.device = device;
    o.kv_store = kv_store;
    Philox rng(9, 0, 0);
    std::vector<runtime::Pending> reqs(10);
    for (size_t i = 0; i < reqs.size(); ++i) {
        reqs[i].index = static_cast<int64_t>(i);
        reqs[i].req.id = "r" + std::to_string(i);
        const uint32_t len = 3 + rng.next_u32() % 20;
        for (uint32_t t = 0; t < len; ++t)
            reqs[i].req.tokens.push_back(3 + rng.next_u32() % 250);
        if (!with_images)
            continue;
        const model::VisionConfig& v = m.cfg.vision;
        std::vector<int64_t>& t = reqs[i].req.tokens;
        std::replace(t.begin(), t.end(), v.media_token_id, v.media_token_id + 1);
        if (i % 3 != 0)
            continue;
        io::Image im;
        im.grid_h = i % 2 == 0 ? 4 : 8, im.grid_w = 4;
        im.pixels.resize(
            static_cast<size_t>(3 * im.grid_h * im.grid_w * v.patch_size * v.patch_size));
        rng.fill_normal(im.pixels.data(), im.pixels.size(), 0.0f, 0.5f);
        const int64_t k = model::vision_tokens(v, im.grid_h, im.grid_w, 1);
        t.insert(t.begin() + 2, static_cast<size_t>(k), v.media_token_id);
        reqs[i].images.push_back(std::move(im));
    }
    size_t next = 0;
    std::vector<runtime::Finished> out;
    const runtime::EngineStats stats = runtime::run_engine(
        m,
        o,
        [&](runtime::Pending& p) {
            if (next == reqs.size())
                return false;
            p = reqs[next++];
            return true;
        },
        [&](runtime::Finished&& f) { out.push_back(std::move(f)); });
    BOOST_TEST(stats.preemptions > 0);
    std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.index < b.index; });
    return out;
}

void expect_same(const std::vector<runtime::Finished>& dev,
                 const std::vector<runtime::Finished>& host) {
    BOOST_REQUIRE_EQUAL(dev.size(), host.size());
    for (size_t i = 0; i < dev.size(); ++i) {
        BOOST_TEST(dev[i].tokens == host[i].tokens, boost::test_tools::per_element());
        BOOST_TEST(dev[i].logprobs == host[i].logprobs, boost::test_tools::per_element());
        BOOST_TEST(dev[i].prompt_logprobs == host[i].prompt_logprobs,
                   boost::test_tools::per_element());
        BOOST_TEST(dev[i].top_tokens == host[i].top_tokens, boost::test_tools::per_element());
        BOOST_TEST(dev[i].top_logprobs == host[i].top_logprobs, boost::test_tools::per_element());
        BOOST_TEST(dev[i].greedy_token == host[i].greedy_token);
        BOOST_TEST(dev[i].greedy_logprob == host[i].greedy_logprob);
    }
}

// 10 requests of a shared 16-token system prompt and their own 2..9 tokens through the engine
// with the prefix cache on (two sequences at a time, so later prompts find earlier prefixes
// stored); the engine's stats in *stats.
std::vector<runtime::Finished> run_cached(const model::Model& m,
                                          model::DeviceModel* device,
                                          runtime::EngineStats* stats) {
    runtime::EngineOptions o;
    o.max_seqs = 2, o.max_tokens = 32, o.prefill_chunk = 8;
    o.max_new_tokens = 4, o.progress_every_s = 0, o.seed = 3;
    o.page_tokens = 4, o.kv_pages = 64;
    o.prompt_logprobs = false;
    o.prefix_cache_bytes = int64_t{1} << 30;
    o.device = device;
    Philox rng(17, 0, 0);
    std::vector<int64_t> system;
    for (int t = 0; t < 16; ++t)
        system.push_back(3 + rng.next_u32() % 250);
    std::vector<runtime::Pending> reqs(10);
    for (size_t i = 0; i < reqs.size(); ++i) {
        reqs[i].index = static_cast<int64_t>(i);
        reqs[i].req.id = "r" + std::to_string(i);
        reqs[i].req.tokens = system;
        const uint32_t len = 2 + rng.next_u32() % 8;
        for (uint32_t t = 0; t < len; ++t)
            reqs[i].req.tokens.push_back(3 + rng.next_u32() % 250);
    }
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

}  // namespace

BOOST_AUTO_TEST_SUITE(engine_device)

BOOST_AUTO_TEST_CASE(a_device_model_runs_every_step_with_the_same_results) {
    model::Model m = model::make_model(model::preset_config("tiny"));
    model::init_model_random(m, 5);
    const std::vector<runtime::Finished> host = run(m, nullptr);
    HostDevice device(m);
    const std::vector<runtime::Finished> dev = run(m, &device);
    BOOST_TEST(device.stores == 1);  // one lane
    BOOST_TEST(device.host_stores == 0);
    BOOST_TEST(device.sequences >= 10);  // every admission and every preemption
    BOOST_TEST(device.forwards > 0);
    expect_same(dev, host);
}

// Greedy with top logprobs, top-k sampling with and without prompt logprobs: the device's top
// rows decide as the whole rows do; sampling without top-k gets the whole rows.
BOOST_AUTO_TEST_CASE(rows_reduced_on_the_device_decide_as_the_whole_rows) {
    model::Model m = model::make_model(model::preset_config("tiny"));
    model::init_model_random(m, 5);
    const Sampling cases[] = {
        {{}, 3, false},              // greedy, top 3 logprobs: every step reduced
        {{0.8, 5, 0.9}, 2, true},    // top-k sampling: decode steps reduced
        {{1.2, 40, 1.0}, 0, false},  // top-k sampling without any prompt logprobs
        {{1.0, 0, 0.9}, 0, false},   // top-p alone reads the whole row: never reduced
    };
    for (const Sampling& c : cases) {
        const std::vector<runtime::Finished> host = run(m, nullptr, c);
        HostDevice device(m);
        expect_same(run(m, &device, c), host);
        if (c.params.temperature > 0 && c.params.top_k == 0)
            BOOST_TEST(device.reduced == 0);
        else if (c.prompt_logprobs)
            BOOST_TEST((device.reduced > 0 && device.reduced < device.forwards));
        else
            BOOST_TEST(device.reduced == device.forwards);
    }
}

BOOST_AUTO_TEST_CASE(a_store_factory_given_with_a_device_makes_the_pools_stores) {
    model::Model m = model::make_model(model::preset_config("tiny"));
    model::init_model_random(m, 5);
    const std::vector<runtime::Finished> host = run(m, nullptr);
    HostDevice device(m);
    const std::vector<runtime::Finished> dev =
        run(m, &device, {}, [&](const model::KvLayout& l) { return device.host_kv_store(l); });
    BOOST_TEST(device.host_stores == 1);  // the factory's, for the one lane
    BOOST_TEST(device.stores == 0);
    BOOST_REQUIRE_EQUAL(dev.size(), host.size());
    for (size_t i = 0; i < dev.size(); ++i)
        BOOST_TEST(dev[i].tokens == host[i].tokens, boost::test_tools::per_element());
}

// Requests with images: the engine asks the device for their tokens, and the results are the
// plain engine's (whose host encoder runs the same vision_forward).
BOOST_AUTO_TEST_CASE(images_are_encoded_by_the_device_model) {
    model::Model m = model::make_model(model::preset_config("tiny"));
    model::init_model_random(m, 5);
    const std::vector<runtime::Finished> host = run(m, nullptr, {}, {}, true);
    HostDevice device(m);
    const std::vector<runtime::Finished> dev = run(m, &device, {}, {}, true);
    BOOST_TEST(device.encodes > 0);
    expect_same(dev, host);
}

// The prefix cache with a device: its snapshots are the device's copies of the KDA states, and
// the results are those of the plain engine with the cache, bit for bit (the same steps).
BOOST_AUTO_TEST_CASE(the_prefix_cache_saves_and_restores_the_device_states) {
    model::Model m = model::make_model(model::preset_config("tiny"));
    model::init_model_random(m, 5);
    runtime::EngineStats host_stats, dev_stats;
    const std::vector<runtime::Finished> host = run_cached(m, nullptr, &host_stats);
    HostDevice device(m);
    const std::vector<runtime::Finished> dev = run_cached(m, &device, &dev_stats);
    BOOST_TEST(host_stats.cache_hits > 0);
    BOOST_TEST(dev_stats.cache_hits == host_stats.cache_hits);
    BOOST_TEST(dev_stats.cached_tokens == host_stats.cached_tokens);
    BOOST_TEST(device.saves > 0);
    BOOST_TEST(device.loads == dev_stats.cache_hits);
    expect_same(dev, host);
}

// The model on a device, made on the CPU, for m.
std::unique_ptr<model::DeviceModel> cpu_device_model(const model::Model& m) {
    model::DeviceModelOptions o;
    o.device = Device::cpu;
    o.dtype = DType::f32;
    o.max_tokens = 32;
    o.max_seqs = 4;
    o.logits_all = true;
    o.arena_bytes = size_t{64} << 20;
    return model::make_device_model(m, o);
}

BOOST_AUTO_TEST_CASE(the_device_model_on_the_cpu_gives_the_engines_results) {
    model::Model m = model::make_model(model::preset_config("tiny"));
    model::init_model_random(m, 5);
    const Sampling cases[] = {{}, {{}, 3, false}, {{0.8, 5, 0.9}, 2, true}};
    for (const Sampling& c : cases)
        expect_same(run(m, cpu_device_model(m).get(), c), run(m, nullptr, c));
    expect_same(run(m, cpu_device_model(m).get(), {}, {}, true), run(m, nullptr, {}, {}, true));
    runtime::EngineStats host_stats, dev_stats;
    const std::vector<runtime::Finished> host = run_cached(m, nullptr, &host_stats);
    const std::vector<runtime::Finished> dev = run_cached(m, cpu_device_model(m).get(), &dev_stats);
    BOOST_TEST(dev_stats.cache_hits == host_stats.cache_hits);
    expect_same(dev, host);
}

BOOST_AUTO_TEST_SUITE_END()
