// The model on a device (model/device_model.h make_device_model) made on the CPU: the GPU's host
// logic (weights uploaded by one walk of the weight list with the routed experts stacked, each
// sequence's KDA block, the step's tables and KDA pointer table, the device-style KV pages and
// attention rows, the saved and loaded KDA states) run on a CPU context, held bit for bit to
// model::forward on the host model over prefill, decode and mixed steps, for the three tiny
// families, also with two LoRA adapters on every target (set_lora_adapters: the adapters' factors
// uploaded, each step's rows per adapter); the KV rows it appends equal the host pool's;
// sequences and KV stores of another model, and the GPU-only host KV tier, are refused.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include "hymoe/core/error.h"
#include "hymoe/core/rng.h"
#include "hymoe/model/device_model.h"
#include "hymoe/model/kv_cache.h"
#include "hymoe/model/lora_model.h"

namespace data = boost::unit_test::data;
using namespace hymoe;
using namespace hymoe::model;

namespace {

const std::vector<std::string> kPresets = {"tiny", "tiny-kimi", "tiny-deepseek"};

DeviceModelOptions on_cpu(DType dtype) {
    DeviceModelOptions o;
    o.device = Device::cpu;
    o.dtype = dtype;
    o.max_tokens = 64;
    o.max_seqs = 4;
    o.arena_bytes = size_t{64} << 20;
    return o;
}

// Two sequences run side by side, on the host model and on its device twin, each in a pool of
// its own (the host's in memory, the device model's in its kv_store).
struct Twins {
    Model& m;
    std::unique_ptr<DeviceModel> dm;
    KvPool host_pool, dev_pool;
    std::vector<SequenceState> host, dev;
    Twins(Model& model, DType dtype)
        : m(model),
          dm(make_device_model(model, on_cpu(dtype))),
          host_pool(model.local, model.shard, 4, 32),
          dev_pool(model.local,
                   model.shard,
                   4,
                   32,
                   [this](const KvLayout& layout) { return dm->kv_store(layout); }),
          host(2),
          dev(2) {
        for (int s = 0; s < 2; ++s) {
            host[s] = make_sequence_state(m);
            attach_kv_pool(m, host[s], host_pool);
            dev[s] = dm->new_sequence();
            attach_kv_pool(m, dev[s], dev_pool);
        }
    }
    ~Twins() {
        for (int s = 0; s < 2; ++s) {
            host_pool.release(host[s].pages);
            dev_pool.release(dev[s].pages);
        }
    }
    // One step of na and nb rows (0: the sequence sits out), the sequences using `adapters` (−1:
    // none; empty: a model without adapters); the two logits, host's first.
    std::pair<Buffer, Buffer> step(int64_t na,
                                   int64_t nb,
                                   Logits which,
                                   const std::vector<int>& adapters = {}) {
        SeqBatch b;
        std::vector<SequenceState*> hs, ds;
        std::vector<int64_t> tokens;
        b.offsets = {0};
        const int64_t n[2] = {na, nb};
        for (int s = 0; s < 2; ++s) {
            if (n[s] == 0)
                continue;
            BOOST_REQUIRE(host_pool.reserve(host[s].pages, host[s].n_tokens + n[s]));
            BOOST_REQUIRE(dev_pool.reserve(dev[s].pages, dev[s].n_tokens + n[s]));
            for (int64_t i = 0; i < n[s]; ++i)
                tokens.push_back((host[s].n_tokens * 37 + i * 11 + s * 5 + 3) % m.cfg.vocab_size);
            b.offsets.push_back(b.offsets.back() + n[s]);
            b.pos0.push_back(host[s].n_tokens);
            if (!adapters.empty())
                b.adapter.push_back(adapters[static_cast<size_t>(s)]);
            hs.push_back(&host[s]);
            ds.push_back(&dev[s]);
        }
        std::pair<Buffer, Buffer> out;
        forward(m, tokens, b, hs, out.first, {which});
        dm->forward(tokens, b, ds, out.second, {which}, nullptr);
        return out;
    }
};

bool bit_equal(const Buffer& a, const Buffer& b) {
    const Tensor& x = a.view();
    const Tensor& y = b.view();
    if (x.shape != y.shape || x.dtype != DType::f32 || y.dtype != DType::f32)
        return false;
    for (int64_t i = 0; i < x.numel(); ++i)
        if (x.ptr<float>()[i] != y.ptr<float>()[i])
            return false;
    return true;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(device_model_cpu)

BOOST_DATA_TEST_CASE(steps_equal_the_host_forward, data::make(kPresets), preset) {
    Model m = make_model(preset_config(preset));
    init_model_random(m, 13);
    Twins t(m, DType::f32);
    // prefill of 5 and 3 rows, three decode steps, a mixed step, a step of one sequence alone
    const struct {
        int64_t na, nb;
        Logits which;
    } steps[] = {{5, 3, Logits::all},
                 {1, 1, Logits::last},
                 {1, 1, Logits::last},
                 {1, 1, Logits::all},
                 {1, 4, Logits::all},
                 {0, 2, Logits::last}};
    for (const auto& s : steps) {
        const auto [want, got] = t.step(s.na, s.nb, s.which);
        BOOST_TEST_INFO(preset << ": a step of " << s.na << " and " << s.nb << " rows");
        BOOST_TEST(bit_equal(want, got));
    }
    for (int s = 0; s < 2; ++s)
        BOOST_TEST(t.dev[s].n_tokens == t.host[s].n_tokens);
}

BOOST_DATA_TEST_CASE(adapted_steps_equal_the_host_forward, data::make(kPresets), preset) {
    Model m = make_model(preset_config(preset));
    init_model_random(m, 3);
    std::vector<std::string> targets = {
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
    if (m.cfg.moe.n_routed_experts > 0)
        targets.insert(targets.end(), {"experts", "shared_experts"});
    LoraModel lm = attach_lora(m, targets, true);
    for (int id = 0; id < 2; ++id) {
        add_lora_adapter(lm, m.shard, 4, 0.5f + static_cast<float>(id), 10 + id, false);
        Philox rng(20 + id, 0, 0);
        for (const TensorSpec& t : lm.tensors(id))
            if (t.name.find("lora_B") != std::string::npos)
                rng.fill_normal(
                    t.dest->ptr<float>(), static_cast<size_t>(shape_numel(t.shape)), 0, 0.2f);
    }
    Twins t(m, DType::f32);
    t.dm->set_lora_adapters(m);
    // adapters 1 and 0, then the base model and 1, then both on adapter 0
    const struct {
        int64_t na, nb;
        std::vector<int> adapters;
    } steps[] = {{6, 4, {1, 0}}, {1, 1, {-1, 1}}, {2, 1, {0, 0}}};
    for (const auto& s : steps) {
        const auto [want, got] = t.step(s.na, s.nb, Logits::all, s.adapters);
        BOOST_TEST_INFO(preset << ": a step of " << s.na << " and " << s.nb << " rows");
        BOOST_TEST(bit_equal(want, got));
    }
}

BOOST_DATA_TEST_CASE(top_tokens_equal_the_host_forward, data::make(kPresets), preset) {
    Model m = make_model(preset_config(preset));
    init_model_random(m, 17);
    const std::unique_ptr<DeviceModel> dm = make_device_model(m, on_cpu(DType::f32));
    const ModelViews views = host_views(m);
    const std::vector<int64_t> tokens = {5, 9, 17, 3, 40, 7, 7, 100};
    SeqBatch b;
    b.offsets = {0, 5, 8};
    b.pos0 = {0, 0};
    KvPool host_pool(m.local, m.shard, 4, 8),
        dev_pool(m.local, m.shard, 4, 8, [&](const KvLayout&l) { return dm->kv_store(l); });
    SequenceState hs[2] = {make_sequence_state(m), make_sequence_state(m)};
    SequenceState ds[2] = {dm->new_sequence(), dm->new_sequence()};
    for (int s = 0; s < 2; ++s) {
        attach_kv_pool(m, hs[s], host_pool);
        attach_kv_pool(m, ds[s], dev_pool);
        BOOST_REQUIRE(host_pool.reserve(hs[s].pages, b.length(s)));
        BOOST_REQUIRE(dev_pool.reserve(ds[s].pages, b.length(s)));
    }
    TopLogits want, got;
    want.n = got.n = 6;
    Buffer none;
    forward(ModelOn{m, m.ctx, views}, tokens, b, {&hs[0], &hs[1]}, none, {Logits::last}, &want);
    dm->forward(tokens, b, {&ds[0], &ds[1]}, none, {Logits::last}, &got);
    BOOST_TEST(none.view().data == nullptr);
    BOOST_TEST(got.tokens == want.tokens);
    BOOST_TEST(got.logits == want.logits);
    BOOST_TEST(got.log_sum == want.log_sum);
    for (int s = 0; s < 2; ++s) {
        host_pool.release(hs[s].pages);
        dev_pool.release(ds[s].pages);
    }
}

BOOST_DATA_TEST_CASE(kv_rows_equal_the_host_pool, data::make(kPresets), preset) {
    Model m = make_model(preset_config(preset));
    init_model_random(m, 19);
    Twins t(m, DType::f32);
    t.step(6, 3, Logits::last);
    t.step(1, 1, Logits::last);
    int64_t compared = 0;
    for (int i = m.shard.first_layer; i < m.shard.end_layer; ++i) {
        if (m.cfg.layers[i].mixer == Mixer::kda)
            continue;
        const int64_t w = t.host_pool.row_width(i);
        BOOST_REQUIRE(t.dev_pool.row_width(i) == w);
        std::vector<float> a(static_cast<size_t>(w)), b(static_cast<size_t>(w));
        for (int s = 0; s < 2; ++s)
            for (int64_t p = 0; p < t.host[s].n_tokens; ++p) {
                const int64_t page = p / t.host_pool.page_tokens(),
                              slot = p % t.host_pool.page_tokens();
                t.host_pool.read_row(i, t.host[s].pages[page], slot, 0, w, a.data());
                t.dev_pool.read_row(i, t.dev[s].pages[page], slot, 0, w, b.data());
                BOOST_TEST_INFO(preset << ": layer " << i << ", sequence " << s << ", key " << p);
                BOOST_TEST(a == b);
                ++compared;
            }
    }
    BOOST_TEST(compared > 0);
}

BOOST_AUTO_TEST_CASE(saved_kda_states_continue_a_sequence) {
    Model m = make_model(preset_config("tiny-kimi"));
    init_model_random(m, 23);
    Twins t(m, DType::f32);
    t.step(7, 2, Logits::last);
    // a third sequence loaded with the first one's states and pages shared goes on as it does
    SequenceState copy = t.dm->new_sequence();
    attach_kv_pool(m, copy, t.dev_pool);
    t.dev_pool.share(copy.pages, t.dev[0].pages);
    t.dm->load_kda_states(t.dm->save_kda_states(t.dev[0]), copy);
    copy.n_tokens = t.dev[0].n_tokens;  // its key 7 goes where the first one's does, the same
    for (int i = m.shard.first_layer; i < m.shard.end_layer; ++i)
        copy.attn[i].n = t.dev[0].attn[i].n;
    Buffer a, b;
    t.dm->forward({42}, single_sequence(1, 7), {&t.dev[0]}, a, {Logits::last}, nullptr);
    t.dm->forward({42}, single_sequence(1, 7), {&copy}, b, {Logits::last}, nullptr);
    BOOST_TEST(bit_equal(a, b));
    t.dev_pool.release(copy.pages);
    // a saved block of another size is refused
    BOOST_CHECK_THROW(t.dm->load_kda_states(Buffer(DType::f32, {3}), copy), Error);
}

BOOST_AUTO_TEST_CASE(foreign_sequences_and_stores_are_refused) {
    Model m = make_model(preset_config("tiny"));
    init_model_random(m, 29);
    const std::unique_ptr<DeviceModel> dm = make_device_model(m, on_cpu(DType::f32));
    const std::unique_ptr<DeviceModel> other = make_device_model(m, on_cpu(DType::f32));
    KvPool host_pool(m.local, m.shard, 4, 8);
    KvPool other_pool(
        m.local, m.shard, 4, 8, [&](const KvLayout& l) { return other->kv_store(l); });
    Buffer logits;
    SequenceState host = make_sequence_state(m);  // no device block
    BOOST_CHECK_THROW(dm->forward({1, 2}, single_sequence(2), {&host}, logits, {}, nullptr), Error);
    SequenceState theirs = other->new_sequence();
    BOOST_CHECK_THROW(dm->forward({1, 2}, single_sequence(2), {&theirs}, logits, {}, nullptr),
                      Error);
    SequenceState on_host_pool = dm->new_sequence(), on_other = dm->new_sequence();
    attach_kv_pool(m, on_host_pool, host_pool);
    attach_kv_pool(m, on_other, other_pool);
    BOOST_REQUIRE(host_pool.reserve(on_host_pool.pages, 2));
    BOOST_REQUIRE(other_pool.reserve(on_other.pages, 2));
    BOOST_CHECK_THROW(dm->forward({1, 2}, single_sequence(2), {&on_host_pool}, logits, {}, nullptr),
                      Error);
    BOOST_CHECK_THROW(dm->forward({1, 2}, single_sequence(2), {&on_other}, logits, {}, nullptr),
                      Error);
    host_pool.release(on_host_pool.pages);
    other_pool.release(on_other.pages);
    KvLayout layout;
    layout.capacity = 1;
    BOOST_CHECK_THROW(dm->host_kv_store(layout), Error);  // the host tier is the GPU's
}

BOOST_AUTO_TEST_CASE(budget_counts_kv_pages_beside_a_step) {
    Model m = make_model(preset_config("tiny-deepseek"));
    init_model_random(m, 31);
    DeviceModelOptions o = on_cpu(DType::f32);
    o.arena_bytes = size_t{1} << 30;  // a step keeps 256 MiB of scores free (the GPU's groups)
    const int64_t page = int64_t{1} << 16;
    const int64_t room = make_device_model(m, o)->kv_page_budget(page);
    BOOST_TEST(room > 0);
    o.arena_bytes += size_t{10} * page;
    BOOST_TEST(make_device_model(m, o)->kv_page_budget(page) == room + 10);
    o.arena_bytes = size_t{1} << 28;  // less than a step holds: no page
    BOOST_TEST(make_device_model(m, o)->kv_page_budget(page) == 0);
}

BOOST_AUTO_TEST_SUITE_END()
