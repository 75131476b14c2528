// LoRA adapters on the GPU model (DeviceModel::set_lora_adapters, src/model/device/device_lora.h)
// against the CPU forward with the same adapters (label cuda; each test is a one-line skip
// without a GPU). Models: tiny (KDA, gated DSA, MoE with shared experts, dense), tiny-kimi (NoPE
// MLA without query latent) and tiny-deepseek (DSA with a query latent), each with two adapters
// of rank 4 (scales 0.5 and 1.5, B drawn nonzero) on every target the CPU has: attention and KDA
// q/k/v/o, MLA's kv_a, dense FFNs, shared experts and every routed expert on its own. Steps: a
// packed prefill of five sequences using adapters 1, base, 0, 1, 0 (so an adapter's rows are two
// separate runs), then one decode row each over the cached pages. Bounds: fp32 as
// tests/cuda/test_model.cpp against the CPU in the same forms (KDA recurrent, attention absorbed),
// 1e-5 relative on the logits: the adapters add fp32 GEMMs of rank 4 whose sums the GPU orders
// otherwise, far below the base model's own rounding differences; bf16 with test_model.cpp's bf16
// bounds against the CPU's default forms (median row ≤ 1e-2, worst ≤ 0.25; the adapters stay
// fp32, their inputs are rounded as the base GEMMs'). And the adapters are not a no-op: on the
// GPU, the adapted sequences' rows differ from the same batch on the base model by more than
// 1e-2 relative while the base sequence's rows stay within the fp32 bound. Then the engine
// (fp32, tiny): requests naming adapters "a", "b" or none give the CPU engine's tokens and
// logprobs.
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "cuda_test.h"
#include "hymoe/core/rng.h"
#include "hymoe/model/device_model.h"
#include "hymoe/model/kv_cache.h"
#include "hymoe/model/lora_model.h"
#include "hymoe/model/model.h"
#include "hymoe/runtime/engine.h"
#include "paged_sequences.h"

namespace utf = boost::unit_test;
using namespace hymoe;
using namespace hymoe::cuda_test;

namespace {

const std::vector<std::string> kPresets = {"tiny", "tiny-kimi", "tiny-deepseek"};
const std::vector<int> kAdapters = {1, -1, 0, 1, 0};
const std::vector<int64_t> kLengths = {9, 5, 12, 3, 1};
constexpr int kPageTokens = 8;
constexpr int64_t kPages = 32;

// The preset's model with two adapters in its slots on every target (held in place: the blocks
// point at the slots).
struct Adapted {
    model::Model m;
    model::LoraModel lm;
    explicit Adapted(const std::string& preset)
        : m(model::make_model(model::preset_config(preset))) {
        model::init_model_random(m, 3);
        std::vector<std::string> targets = {
            "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
        if (m.cfg.moe.n_routed_experts > 0)
            targets.insert(targets.end(), {"experts", "shared_experts"});
        lm = model::attach_lora(m, targets, true);
        for (int id = 0; id < 2; ++id) {
            model::add_lora_adapter(lm, m.shard, 4, 0.5f + static_cast<float>(id), 10 + id, false);
            Philox rng(20 + id, 0, 0);
            for (const model::TensorSpec& t : lm.tensors(id))
                if (t.name.find("lora_B") != std::string::npos)
                    rng.fill_normal(
                        t.dest->ptr<float>(), static_cast<size_t>(shape_numel(t.shape)), 0, 0.2f);
        }
    }
};

std::unique_ptr<model::DeviceModel> device_model(const model::Model& m, DType dtype) {
    model::DeviceModelOptions o;
    o.dtype = dtype;
    o.max_tokens = 256;
    o.max_seqs = 16;
    o.logits_all = true;
    o.memory_fraction = 0.05;
    auto dm = model::make_device_model(m, o);
    dm->set_lora_adapters(m);
    return dm;
}

// Every row's logits of the two steps (prefill, then one decode row each) on the CPU (device
// null) or the GPU, the sequences using `adapters`.
std::vector<Buffer> run(const model::Model& m,
                        model::DeviceModel* device,
                        const std::vector<int>& adapters,
                        model::KdaMode kda = model::KdaMode::automatic,
                        model::AttnMode attn = model::AttnMode::automatic) {
    PagedSequences paged = paged_sequences(m, device, kPageTokens, kPages, kLengths.size());
    std::unique_ptr<model::KvPool>& pool = paged.pool;
    std::vector<model::SequenceState>& states = paged.states;
    std::vector<model::SequenceState*> ptrs;
    for (model::SequenceState& st : states)
        ptrs.push_back(&st);
    const int64_t V = m.cfg.vocab_size;
    std::vector<Buffer> out;
    for (int step = 0; step < 2; ++step) {
        std::vector<int64_t> tokens;
        model::SeqBatch batch{{0}, {}, adapters};
        for (size_t s = 0; s < kLengths.size(); ++s) {
            const int64_t pos0 = step == 0 ? 0 : kLengths[s];
            const int64_t n = step == 0 ? kLengths[s] : 1;
            BOOST_REQUIRE(pool->reserve(states[s].pages, pos0 + n));
            for (int64_t i = 0; i < n; ++i)
                tokens.push_back((3 + (pos0 + i) * 31 + static_cast<int64_t>(s) * 17) % V);
            batch.pos0.push_back(pos0);
            batch.offsets.push_back(static_cast<int64_t>(tokens.size()));
        }
        model::ForwardOptions fo;
        fo.kda_mode = kda;
        fo.attn_mode = attn;
        Buffer logits;
        if (device)
            device->forward(tokens, batch, ptrs, logits, fo, nullptr);
        else
            model::forward(m, tokens, batch, ptrs, logits, fo);
        out.push_back(std::move(logits));
    }
    return out;
}

// The relative error of every row of every step, in order.
std::vector<double> row_errors(const std::vector<Buffer>& got, const std::vector<Buffer>& want) {
    BOOST_REQUIRE_EQUAL(got.size(), want.size());
    std::vector<double> rel;
    for (size_t k = 0; k < got.size(); ++k) {
        BOOST_REQUIRE((got[k].view().shape == want[k].view().shape));
        const int64_t V = got[k].view().dim(1);
        for (int64_t r = 0; r < got[k].view().dim(0); ++r)
            rel.push_back(rel_error(got[k].ptr<float>() + r * V, want[k].ptr<float>() + r * V, V));
    }
    return rel;
}

// The sequence of each row of `row_errors`' order.
std::vector<size_t> row_sequences() {
    std::vector<size_t> seq;
    for (size_t s = 0; s < kLengths.size(); ++s)
        seq.insert(seq.end(), static_cast<size_t>(kLengths[s]), s);
    for (size_t s = 0; s < kLengths.size(); ++s)
        seq.push_back(s);
    return seq;
}

// 12 requests of 1..30 tokens naming adapters "a", "b" and none in turn, through run_engine
// (mixed prefill and decode steps, few pages: preemptions) on the CPU or the GPU.
std::vector<runtime::Finished> run_engine(const model::Model& m, model::DeviceModel* device) {
    runtime::EngineOptions o;
    o.max_seqs = 6, o.max_tokens = 48, o.prefill_chunk = 16;
    o.max_new_tokens = 6, o.progress_every_s = 0, o.seed = 3;
    o.page_tokens = kPageTokens, o.kv_pages = 16;
    o.prompt_logprobs = true;
    o.device = device;
    o.adapter_ids = {{"a", 0}, {"b", 1}};
    std::vector<runtime::Pending> reqs;
    Philox rng(13, 0, 0);
    const std::string names[] = {"a", "", "b"};
    for (int i = 0; i < 12; ++i) {
        runtime::Pending& p = reqs.emplace_back();
        p.index = i;
        p.req.id = "r" + std::to_string(i);
        p.req.line = i + 1;
        p.req.adapter = names[i % 3];
        const int64_t len = 1 + rng.next_u32() % 30;
        for (int64_t t = 0; t < len; ++t)
            p.req.tokens.push_back(3 + rng.next_u32() % 253);
    }
    size_t next = 0;
    std::vector<runtime::Finished> out;
    runtime::run_engine(
        m,
        o,
        [&](runtime::Pending& p) {
            if (next == reqs.size())
                return false;
            p = reqs[next++];
            return true;
        },
        [&](runtime::Finished&& f) { out.push_back(std::move(f)); });
    std::sort(out.begin(), out.end(), [](auto& x, auto& y) { return x.index < y.index; });
    return out;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(cuda_lora, *utf::label("cuda"))

BOOST_AUTO_TEST_CASE(fp32_adapters_match_the_cpu, *utf::precondition(need_gpu)) {
    const std::vector<int> base(kAdapters.size(), -1);
    for (const std::string& preset : kPresets) {
        BOOST_TEST_CONTEXT(preset) {
            const auto a = std::make_unique<Adapted>(preset);
            const auto dm = device_model(a->m, DType::f32);
            const std::vector<Buffer> cpu =
                run(a->m, nullptr, kAdapters, model::KdaMode::recurrent, model::AttnMode::absorbed);
            const std::vector<Buffer> gpu = run(a->m, dm.get(), kAdapters);
            const std::vector<double> rel = row_errors(gpu, cpu);
            const double worst = *std::max_element(rel.begin(), rel.end());
            BOOST_TEST_MESSAGE(preset << " fp32 with adapters: worst row relative " << worst);
            BOOST_TEST(worst <= 1e-5);

            // not a no-op: the adapted rows move, the base sequence's do not
            const std::vector<Buffer> gpu_base = run(a->m, dm.get(), base);
            const std::vector<double> moved = row_errors(gpu, gpu_base);
            const std::vector<size_t> seq = row_sequences();
            for (size_t r = 0; r < moved.size(); ++r)
                BOOST_TEST_CONTEXT("row " << r << " of sequence " << seq[r]) {
                    if (kAdapters[seq[r]] >= 0)
                        BOOST_TEST(moved[r] > 1e-2);
                    else
                        BOOST_TEST(moved[r] <= 1e-5);
                }
        }
    }
}

BOOST_AUTO_TEST_CASE(bf16_adapters_are_close_to_the_cpu, *utf::precondition(need_gpu)) {
    for (const std::string& preset : kPresets) {
        BOOST_TEST_CONTEXT(preset) {
            const auto a = std::make_unique<Adapted>(preset);
            const auto dm = device_model(a->m, DType::bf16);
            std::vector<double> rel =
                row_errors(run(a->m, dm.get(), kAdapters), run(a->m, nullptr, kAdapters));
            std::sort(rel.begin(), rel.end());
            BOOST_TEST_MESSAGE(preset << " bf16 with adapters: rows relative to the CPU: median "
                                      << rel[rel.size() / 2] << ", worst " << rel.back());
            BOOST_TEST(rel[rel.size() / 2] <= 1e-2);
            BOOST_TEST(rel.back() <= 0.25);
        }
    }
}

// The engine with the device and requests naming adapters: the CPU engine's tokens, and its
// logprobs and prompt logprobs to 2e-5 (test_model.cpp's engine bound).
BOOST_AUTO_TEST_CASE(engine_requests_with_adapters_match_the_cpu, *utf::precondition(need_gpu)) {
    const auto a = std::make_unique<Adapted>("tiny");
    const std::vector<runtime::Finished> cpu = run_engine(a->m, nullptr);
    const auto dm = device_model(a->m, DType::f32);
    const std::vector<runtime::Finished> gpu = run_engine(a->m, dm.get());
    BOOST_REQUIRE_EQUAL(gpu.size(), cpu.size());
    for (size_t i = 0; i < gpu.size(); ++i) {
        BOOST_TEST_CONTEXT("request " << cpu[i].index) {
            BOOST_TEST(gpu[i].index == cpu[i].index);
            BOOST_TEST(gpu[i].tokens == cpu[i].tokens, boost::test_tools::per_element());
            BOOST_REQUIRE_EQUAL(gpu[i].logprobs.size(), cpu[i].logprobs.size());
            BOOST_REQUIRE_EQUAL(gpu[i].prompt_logprobs.size(), cpu[i].prompt_logprobs.size());
            for (size_t k = 0; k < gpu[i].logprobs.size(); ++k)
                BOOST_TEST(std::abs(gpu[i].logprobs[k] - cpu[i].logprobs[k]) <= 2e-5f);
            for (size_t k = 0; k < gpu[i].prompt_logprobs.size(); ++k)
                BOOST_TEST(std::abs(gpu[i].prompt_logprobs[k] - cpu[i].prompt_logprobs[k]) <=
                           2e-5f);
        }
    }
}

BOOST_AUTO_TEST_SUITE_END()
