// The engine's device hooks (EngineOptions::device, model/device_model.h) in every build: a
// DeviceModel that runs the host forward makes the sequences, the pools' stores and every step's
// forward (or, given EngineOptions::kv_store, that factory makes the stores), and the engine's
// results are bit for bit those of the plain engine, with preemptions.
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "hymoe/core/rng.h"
#include "hymoe/model/device_model.h"
#include "hymoe/runtime/engine.h"

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
    void forward(const std::vector<int64_t>& tokens,
                 const model::SeqBatch& batch,
                 const std::vector<model::SequenceState*>& states,
                 Buffer& logits,
                 const model::ForwardOptions& options) override {
        ++forwards;
        model::forward(m_, tokens, batch, states, logits, options);
    }
    std::string describe() const override { return "host"; }

    int sequences = 0, stores = 0, host_stores = 0, forwards = 0;

private:
    const model::Model& m_;
};

std::vector<runtime::Finished> run(const model::Model& m,
                                   model::DeviceModel* device,
                                   const model::KvStoreFactory& kv_store = {}) {
    runtime::EngineOptions o;
    o.max_seqs = 4, o.max_tokens = 32, o.prefill_chunk = 8;
    o.max_new_tokens = 6, o.progress_every_s = 0, o.seed = 3;
    o.page_tokens = 4, o.kv_pages = 14;  // few pages: preemptions
    o.prompt_logprobs = true;
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
    BOOST_REQUIRE_EQUAL(dev.size(), host.size());
    for (size_t i = 0; i < dev.size(); ++i) {
        BOOST_TEST(dev[i].tokens == host[i].tokens, boost::test_tools::per_element());
        BOOST_TEST(dev[i].logprobs == host[i].logprobs, boost::test_tools::per_element());
        BOOST_TEST(dev[i].prompt_logprobs == host[i].prompt_logprobs,
                   boost::test_tools::per_element());
    }
}

BOOST_AUTO_TEST_CASE(a_store_factory_given_with_a_device_makes_the_pools_stores) {
    model::Model m = model::make_model(model::preset_config("tiny"));
    model::init_model_random(m, 5);
    const std::vector<runtime::Finished> host = run(m, nullptr);
    HostDevice device(m);
    const std::vector<runtime::Finished> dev =
        run(m, &device, [&](const model::KvLayout& l) { return device.host_kv_store(l); });
    BOOST_TEST(device.host_stores == 1);  // the factory's, for the one lane
    BOOST_TEST(device.stores == 0);
    BOOST_REQUIRE_EQUAL(dev.size(), host.size());
    for (size_t i = 0; i < dev.size(); ++i)
        BOOST_TEST(dev[i].tokens == host[i].tokens, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_SUITE_END()
