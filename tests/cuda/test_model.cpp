// The GPU model (model/device_model.h) against the CPU model on the same random weights (label
// cuda; each test is a one-line skip without a GPU). Models: tiny (KDA, gated DSA, MoE with
// groups, dense), tiny-kimi (NoPE MLA without query latent, one group), tiny-deepseek (DSA
// throughout, YaRN RoPE), tiny with LatentMoE relu2 experts, and tiny-deepseek-r128 (a 128 + 16
// latent, which the fused DSA kernels take: its bf16 steps run DSA fused). Steps: three sequences
// paged into 8-token pages, prefill chunks of every kind in one batch (a whole prompt, a chunk, a
// single-token first row), then a continuation mixing a decode row with chunks, then decode
// steps; DSA's top-8 is below every context past 8 tokens, so the sparse paths are exercised.
// Bounds. fp32: the GPU sums in other orders (cuBLAS, block reductions) than the CPU, so
// against the CPU in the same forms (KDA recurrent, attention absorbed) the logprobs agree to
// 1e-5 and the logits to 1e-5 relative; against the CPU's own default forms (chunked KDA, expanded
// attention for prefill) to 2e-5, the bound the CPU's chunked-vs-whole prefill test uses. bf16:
// every matrix and GEMM input is rounded to bf16 (2^-9 relative): about 4e-3 relative on the
// logits (measured by running this file on a host emulation of the kernels, not kept in the
// repository); the median row must be within 1e-2 and the worst within
// 0.25, since a token whose normed input moves by that much may route to another expert (5e-2 to
// 8e-2 on its rows and the later rows of its sequence); the same bounds for the fused DSA kernels
// against the generic ops on the GPU, both bf16. Then the engine: greedy tokens, their
// logprobs and the prompt logprobs of 16 requests through run_engine (mixed steps, few KV pages so
// that sequences are preempted and pages and states reused) equal the CPU engine's. The host KV
// tier (DeviceModel::host_kv_store: pages in pinned host memory, two layers' slots on the GPU):
// the same plan and the same engine run give bit for bit the logits, tokens and logprobs of the
// pages kept on the GPU (tiny: one attention layer, one slot; tiny-deepseek: four, both slots in
// turn with prefetch; tiny-mixed: DSA and MLA layers alternating, so slots of one width hold
// rows of another; also in bf16), and in fp32 the host rows after the plan are the CPU pool's
// (1e-5 relative).
// Decode graphs (DeviceModelOptions::graphs): bf16 models built to qualify (tiny-kimi, tiny with
// its DSA layer as gated MLA and tiny-deepseek with the fused DSA kernels' latent, all widened to
// the fused MoE kernels' sizes) run 16 prompts, then the same decode steps of 3, 1, 5, 16 and 3
// sequences (buckets 4, 1, 8, 16, 4; one with a context past 256 keys, another key bucket) with
// graphs on and off: equal greedy tokens, logits within 1e-6 relative (the same kernels on the
// same rows; the padded rows are dropped), and the counters show each (bucket, key bucket)
// warmed up and captured once and every step replayed (the last step's rows reduced to their top
// tokens); then a second pool of the same geometry re-captures the graphs (refresh) and still
// matches, and a pool in the host KV tier runs eagerly.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "cuda_test.h"
#include "hymoe/core/rng.h"
#include "hymoe/model/device_model.h"
#include "hymoe/model/kv_cache.h"
#include "hymoe/model/model.h"
#include "hymoe/runtime/engine.h"
#include "paged_sequences.h"

namespace utf = boost::unit_test;
using namespace hymoe;
using namespace hymoe::cuda_test;

namespace {

const std::vector<std::string> kModels = {"tiny", "tiny-kimi", "tiny-deepseek", "tiny-latent"};
// tiny-deepseek with the latent the fused DSA kernels take (r_kv 128, d_r 16; the tiny presets'
// 32 + 8 is not), so that a bf16 step with fused kernels runs its DSA layers through them.
const std::string kFusedDsa = "tiny-deepseek-r128";

model::ModelConfig config_of(const std::string& name) {
    if (name == kFusedDsa) {
        model::ModelConfig c = model::preset_config("tiny-deepseek");
        c.mla.kv_lora_rank = 128;
        c.mla.qk_rope_head_dim = 16;
        return c;
    }
    if (name == "tiny-mixed") {  // DSA, MLA, DSA, MLA: two row widths
        model::ModelConfig c = model::preset_config("tiny-deepseek");
        c.layers[1].mixer = c.layers[3].mixer = model::Mixer::mla;
        return c;
    }
    if (name != "tiny-latent")
        return model::preset_config(name);
    model::ModelConfig c = model::preset_config("tiny");  // its MoE layers as LatentMoE, relu2
    for (model::LayerSpec& l : c.layers)
        if (l.ffn == model::Ffn::moe)
            l.ffn = model::Ffn::latent_moe;
    c.moe.expert_act = model::ExpertAct::relu2;
    return c;
}

model::Model host_model(const std::string& name) {
    model::Model m = model::make_model(config_of(name));
    model::init_model_random(m, 7);
    return m;
}

std::unique_ptr<model::DeviceModel> device_model(const model::Model& m,
                                                 DType dtype,
                                                 bool fused = true) {
    model::DeviceModelOptions o;
    o.dtype = dtype;
    o.fused = fused;
    o.max_tokens = 256;
    o.max_seqs = 16;
    o.logits_all = true;
    o.memory_fraction = 0.05;  // a few GB: tests may hold two models
    return model::make_device_model(m, o);
}

constexpr int kPageTokens = 8;
constexpr int64_t kPages = 64;
const std::vector<int64_t> kLengths = {13, 29, 40};  // the three prompts

// The three prompts (ids 3..255).
std::vector<std::vector<int64_t>> prompts() {
    Philox rng(21, 0, 0);
    std::vector<std::vector<int64_t>> p;
    for (int64_t n : kLengths) {
        p.emplace_back();
        for (int64_t t = 0; t < n; ++t)
            p.back().push_back(3 + rng.next_u32() % 253);
    }
    return p;
}

// One forward's rows: (sequence, first token, count) per sequence in the batch.
struct Part {
    int seq;
    int64_t begin, count;
};

// The step plan: prefill kinds together, a continuation mixing a decode row with chunks, decodes.
std::vector<std::vector<Part>> step_plan() {
    std::vector<std::vector<Part>> plan = {
        {{0, 0, 13}, {1, 0, 16}, {2, 0, 1}},
        {{0, 13, 1}, {1, 16, 13}, {2, 1, 39}},
    };
    for (int k = 0; k < 5; ++k)
        plan.push_back({{0, 14 + k, 1}, {1, 29 + k, 1}, {2, 40 + k, 1}});
    return plan;
}

// Runs the plan on one side (the CPU when device is null), all logits rows of every step in
// order. Tokens after a prompt are the CPU-side greedy choices fed to both sides (`fed`, filled by
// the first run).
struct Side {
    const model::Model& m;
    model::DeviceModel* device = nullptr;
    model::KdaMode kda = model::KdaMode::automatic;
    model::AttnMode attn = model::AttnMode::automatic;
    bool host_tier = false;  // the device's pages in its host tier (host_kv_store)
};

// rows, when given, gets every sequence's cached rows after the plan (the CPU's, or the host
// tier's): per sequence, per MLA/DSA layer, its tokens' rows in order.
std::vector<Buffer> run_plan(const Side& side,
                             std::vector<std::vector<int64_t>>& fed,
                             std::vector<float>* rows = nullptr) {
    PagedSequences paged =
        paged_sequences(side.m, side.device, kPageTokens, kPages, kLengths.size(), side.host_tier);
    std::unique_ptr<model::KvPool>& pool = paged.pool;
    std::vector<model::SequenceState>& states = paged.states;
    const bool first = fed.empty();
    if (first)
        fed = prompts();
    std::vector<Buffer> out;
    for (const std::vector<Part>& step : step_plan()) {
        std::vector<int64_t> tokens;
        model::SeqBatch batch{{0}, {}, {}};
        std::vector<model::SequenceState*> ptrs;
        // steps that continue past the prompts ask for each sequence's last row only
        const bool last_rows = step.front().begin >= kLengths[step.front().seq];
        for (const Part& p : step) {
            model::SequenceState& st = states[static_cast<size_t>(p.seq)];
            BOOST_REQUIRE(pool->reserve(st.pages, p.begin + p.count));
            const std::vector<int64_t>& seq = fed[static_cast<size_t>(p.seq)];
            BOOST_REQUIRE(static_cast<int64_t>(seq.size()) >= p.begin + p.count);
            tokens.insert(tokens.end(), seq.begin() + p.begin, seq.begin() + p.begin + p.count);
            batch.pos0.push_back(p.begin);
            batch.offsets.push_back(static_cast<int64_t>(tokens.size()));
            ptrs.push_back(&st);
        }
        model::ForwardOptions fo;
        fo.logits = last_rows ? model::Logits::last : model::Logits::all;
        fo.kda_mode = side.kda;
        fo.attn_mode = side.attn;
        Buffer logits;
        if (side.device)
            side.device->forward(tokens, batch, ptrs, logits, fo, nullptr);
        else
            model::forward(side.m, tokens, batch, ptrs, logits, fo);
        if (first) {  // the next token of every sequence whose last row ends its known tokens
            const int64_t V = side.m.cfg.vocab_size;
            for (size_t i = 0; i < step.size(); ++i) {
                const Part& p = step[i];
                std::vector<int64_t>& seq = fed[static_cast<size_t>(p.seq)];
                if (p.begin + p.count != static_cast<int64_t>(seq.size()))
                    continue;
                const int64_t row = last_rows ? static_cast<int64_t>(i) : batch.offsets[i + 1] - 1;
                const float* x = logits.ptr<float>() + row * V;
                seq.push_back(std::max_element(x, x + V) - x);
            }
        }
        out.push_back(std::move(logits));
    }
    if (rows != nullptr)
        for (const model::SequenceState& st : states)
            for (size_t l = 0; l < side.m.cfg.layers.size(); ++l) {
                const int64_t w = pool->row_width(static_cast<int>(l));
                for (int64_t t = 0; w > 0 && t < st.n_tokens; ++t) {
                    rows->resize(rows->size() + static_cast<size_t>(w));
                    pool->read_row(static_cast<int>(l),
                                   st.pages[static_cast<size_t>(t / kPageTokens)],
                                   t % kPageTokens,
                                   0,
                                   w,
                                   rows->data() + rows->size() - w);
                }
            }
    return out;
}

// log_softmax of every row, in double.
std::vector<double> logprobs(const Buffer& logits) {
    const int64_t rows = logits.view().dim(0), V = logits.view().dim(1);
    std::vector<double> lp(static_cast<size_t>(rows * V));
    for (int64_t r = 0; r < rows; ++r) {
        const float* x = logits.ptr<float>() + r * V;
        const double mx = *std::max_element(x, x + V);
        double sum = 0;
        for (int64_t i = 0; i < V; ++i)
            sum += std::exp(static_cast<double>(x[i]) - mx);
        for (int64_t i = 0; i < V; ++i)
            lp[static_cast<size_t>(r * V + i)] = static_cast<double>(x[i]) - mx - std::log(sum);
    }
    return lp;
}

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
    double m = 0;
    for (size_t i = 0; i < a.size(); ++i)
        m = std::max(m, std::abs(a[i] - b[i]));
    return m;
}

// Every step's logits: relative error and the largest logprob difference.
void check_fp32(const std::vector<Buffer>& gpu, const std::vector<Buffer>& cpu, double tol) {
    BOOST_REQUIRE_EQUAL(gpu.size(), cpu.size());
    for (size_t k = 0; k < gpu.size(); ++k) {
        BOOST_TEST_CONTEXT("step " << k) {
            BOOST_REQUIRE((gpu[k].view().shape == cpu[k].view().shape));
            const double rel =
                rel_error(gpu[k].ptr<float>(), cpu[k].ptr<float>(), gpu[k].view().numel());
            const double lp = max_abs_diff(logprobs(gpu[k]), logprobs(cpu[k]));
            BOOST_TEST_MESSAGE("step " << k << ": logits rel " << rel << ", logprobs " << lp);
            BOOST_TEST(rel <= tol);
            BOOST_TEST(lp <= tol);
        }
    }
}

// Per logits row of every step, the relative error of `got` against `want`.
struct RowErrors {
    double median = 0, worst = 0;
    bool finite = true;  // every logit of `got`
};

RowErrors row_errors(const std::vector<Buffer>& got, const std::vector<Buffer>& want) {
    BOOST_REQUIRE_EQUAL(got.size(), want.size());
    std::vector<double> rel;
    RowErrors e;
    for (size_t k = 0; k < got.size(); ++k) {
        BOOST_REQUIRE((got[k].view().shape == want[k].view().shape));
        const int64_t V = got[k].view().dim(1);
        for (int64_t r = 0; r < got[k].view().dim(0); ++r) {
            const float* g = got[k].ptr<float>() + r * V;
            e.finite = e.finite && std::all_of(g, g + V, [](float x) { return std::isfinite(x); });
            rel.push_back(rel_error(g, want[k].ptr<float>() + r * V, V));
        }
    }
    std::sort(rel.begin(), rel.end());
    e.median = rel[rel.size() / 2];
    e.worst = rel.back();
    return e;
}

// 16 requests of 1..40 tokens, some with their own max_new_tokens.
std::vector<runtime::Pending> requests() {
    std::vector<runtime::Pending> reqs;
    Philox rng(11, 0, 0);
    for (int i = 0; i < 16; ++i) {
        runtime::Pending p;
        p.index = i;
        p.req.id = "r" + std::to_string(i);
        p.req.line = i + 1;
        const int64_t len = 1 + rng.next_u32() % 40;
        for (int64_t t = 0; t < len; ++t)
            p.req.tokens.push_back(3 + rng.next_u32() % 253);
        const int own[] = {-1, -1, -1, 0, 1, 5};
        p.req.max_new_tokens = own[i % 6];
        reqs.push_back(p);
    }
    return reqs;
}

std::vector<runtime::Finished> run_engine(const model::Model& m,
                                          model::DeviceModel* device,
                                          bool host_tier = false) {
    runtime::EngineOptions o;
    o.max_seqs = 6, o.max_tokens = 48, o.prefill_chunk = 16;
    o.max_new_tokens = 8, o.progress_every_s = 0, o.seed = 3;
    o.page_tokens = kPageTokens, o.kv_pages = 16;  // few pages: preemptions
    o.prompt_logprobs = true;
    o.device = device;
    if (host_tier)
        o.kv_store = [device](const model::KvLayout& l) { return device->host_kv_store(l); };
    const std::vector<runtime::Pending> reqs = requests();
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
    BOOST_TEST_MESSAGE((device ? "GPU" : "CPU") << " engine: " << stats.steps << " steps, "
                                                << stats.preemptions << " preemptions");
    std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.index < b.index; });
    return out;
}

// ---- decode graphs --------------------------------------------------------------------------

// A preset widened so that its MoE layers fit the fused kernels (d and latent multiples of 128,
// expert widths of 64): decode graphs qualify. tiny-deepseek gets the 128 + 16 latent of the fused
// DSA kernels (and positions past its 256); tiny's gated DSA layer becomes gated MLA.
model::Model graph_model(const std::string& preset) {
    model::ModelConfig c = model::preset_config(preset);
    c.hidden_size = 128;
    c.moe.moe_intermediate = 64;
    c.moe.shared_intermediate = 64;
    if (preset == "tiny-deepseek") {
        c.mla.kv_lora_rank = 128;
        c.mla.qk_rope_head_dim = 16;
        c.max_position = 4096;
    }
    for (model::LayerSpec& l : c.layers)
        if (l.mixer == model::Mixer::dsa && preset == "tiny")
            l.mixer = model::Mixer::mla;
    model::Model m = model::make_model(c);
    model::init_model_random(m, 9);
    return m;
}

std::unique_ptr<model::DeviceModel> graph_device(const model::Model& m, bool graphs) {
    model::DeviceModelOptions o;
    o.dtype = DType::bf16;
    o.max_tokens = 512;
    o.max_seqs = 16;
    o.memory_fraction = 0.05;
    o.graphs = graphs;
    return model::make_device_model(m, o);
}

// 16 sequences in a pool of the device (256 pages): prompts of 5 to 35 tokens (sequence 0: 300, so
// that its decode rows need the key bucket of 512), each prefilled in its own forward, then decode
// steps over sequence ranges (first, count), each feeding every sequence its greedy token; the last
// step asks for each row's top 4 tokens (TopLogits) instead of its logits. Returns the decode
// steps' logits, the last as its top logits [count, 4] and then its top token ids [count, 4];
// tokens gets every sequence's tokens.
std::vector<Buffer> run_decodes(const model::Model& m,
                                model::DeviceModel& dev,
                                model::KvPool& pool,
                                const std::vector<std::pair<int, int>>& steps,
                                std::vector<std::vector<int64_t>>& tokens) {
    const int n_seq = 16;
    std::vector<model::SequenceState> states;
    for (int i = 0; i < n_seq; ++i)
        states.push_back(dev.new_sequence());
    for (model::SequenceState& st : states)
        model::attach_kv_pool(m, st, pool);
    Philox rng(31, 0, 0);
    tokens.assign(n_seq, {});
    const int64_t V = m.cfg.vocab_size;
    auto forward = [&](int first, int count, bool prefill, model::TopLogits* top) {
        std::vector<int64_t> ids;
        model::SeqBatch batch{{0}, {}, {}};
        std::vector<model::SequenceState*> ptrs;
        for (int q = first; q < first + count; ++q) {
            model::SequenceState& st = states[static_cast<size_t>(q)];
            const std::vector<int64_t>& seq = tokens[static_cast<size_t>(q)];
            BOOST_REQUIRE(pool.reserve(st.pages, static_cast<int64_t>(seq.size())));
            const int64_t begin = prefill ? 0 : static_cast<int64_t>(seq.size()) - 1;
            ids.insert(ids.end(), seq.begin() + begin, seq.end());
            batch.pos0.push_back(begin);
            batch.offsets.push_back(static_cast<int64_t>(ids.size()));
            ptrs.push_back(&st);
        }
        model::ForwardOptions fo;
        fo.logits = model::Logits::last;
        Buffer logits;
        dev.forward(ids, batch, ptrs, logits, fo, top);
        for (int i = 0; i < count; ++i) {  // the greedy next token
            const float* x = logits.ptr<float>() + i * V;
            tokens[static_cast<size_t>(first + i)].push_back(
                top ? top->tokens[static_cast<size_t>(i * top->n)]
                    : std::max_element(x, x + V) - x);
        }
        return logits;
    };
    for (int q = 0; q < n_seq; ++q) {
        const int64_t len = q == 0 ? 300 : 5 + rng.next_u32() % 31;
        for (int64_t t = 0; t < len; ++t)
            tokens[static_cast<size_t>(q)].push_back(3 + rng.next_u32() % 253);
        forward(q, 1, true, nullptr);
    }
    std::vector<Buffer> out;
    for (size_t k = 0; k + 1 < steps.size(); ++k)
        out.push_back(forward(steps[k].first, steps[k].second, false, nullptr));
    model::TopLogits top;
    top.n = 4;
    const int count = steps.back().second;
    forward(steps.back().first, count, false, &top);
    Buffer values(DType::f32, {count, top.n}), ids(DType::f32, {count, top.n});
    for (size_t i = 0; i < top.logits.size(); ++i) {
        values.ptr<float>()[i] = top.logits[i];
        ids.ptr<float>()[i] = static_cast<float>(top.tokens[i]);
    }
    out.push_back(std::move(values));
    out.push_back(std::move(ids));
    for (model::SequenceState& st : states)
        pool.release(st.pages);
    return out;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(cuda_model, *utf::label("cuda"))

BOOST_AUTO_TEST_CASE(fp32_forward_matches_the_cpu, *utf::precondition(need_gpu)) {
    for (const std::string& name : kModels) {
        const model::Model m = host_model(name);
        std::vector<std::vector<int64_t>> fed;
        const std::vector<Buffer> cpu = run_plan({m}, fed);  // fills fed: the greedy continuations
        const std::vector<Buffer> same_forms =
            run_plan({m, nullptr, model::KdaMode::recurrent, model::AttnMode::absorbed}, fed);
        const auto dm = device_model(m, DType::f32);
        BOOST_TEST_MESSAGE(name << ": " << dm->describe());
        const std::vector<Buffer> gpu = run_plan({m, dm.get()}, fed);
        BOOST_TEST_CONTEXT(name << " against the CPU in the same forms") {
            check_fp32(gpu, same_forms, 1e-5);
        }
        BOOST_TEST_CONTEXT(name << " against the CPU's default forms") {
            check_fp32(gpu, cpu, 2e-5);
        }
    }
}

BOOST_AUTO_TEST_CASE(bf16_forward_is_close_to_the_cpu, *utf::precondition(need_gpu)) {
    for (const std::string& name : {std::string("tiny"), kFusedDsa}) {
        const model::Model m = host_model(name);
        std::vector<std::vector<int64_t>> fed;
        const std::vector<Buffer> cpu = run_plan({m}, fed);
        const auto dm = device_model(m, DType::bf16);
        const std::vector<Buffer> gpu = run_plan({m, dm.get()}, fed);
        const RowErrors e = row_errors(gpu, cpu);
        BOOST_TEST_MESSAGE(name << " bf16: logit rows relative to the CPU: median " << e.median
                                << ", worst " << e.worst);
        BOOST_TEST_CONTEXT(name) {
            BOOST_TEST(e.finite);
            BOOST_TEST(e.median <= 1e-2);
            BOOST_TEST(e.worst <= 0.25);
        }
    }
}

// The fused DSA kernels (indexer_topk, mla_sparse) against the generic ops, both on the GPU in
// bf16 on the same tokens: the fused path rounds q̂, the latent rows and the probabilities to bf16
// (2^-9 relative) where the generic one keeps them fp32, about the bf16 GEMMs' own 4e-3 on the
// logits, hence the same bounds as against the CPU: the median row within 1e-2, the worst within
// 0.25 (its indexer ranks bf16-rounded q and k, so a key within ~1e-2 of a row's k-th score may
// swap, which like an expert flip moves that row and its sequence's later rows). The two differ
// at all (the fused path ran).
BOOST_AUTO_TEST_CASE(bf16_fused_dsa_is_close_to_the_generic_path, *utf::precondition(need_gpu)) {
    const model::Model m = host_model(kFusedDsa);
    std::vector<std::vector<int64_t>> fed;
    const auto generic = device_model(m, DType::bf16, false);
    const std::vector<Buffer> want = run_plan({m, generic.get()}, fed);
    const auto fused = device_model(m, DType::bf16, true);
    const std::vector<Buffer> got = run_plan({m, fused.get()}, fed);
    const RowErrors e = row_errors(got, want);
    BOOST_TEST_MESSAGE("fused DSA vs generic, bf16: logit rows relative: median "
                       << e.median << ", worst " << e.worst);
    BOOST_TEST(e.finite);
    BOOST_TEST(e.median <= 1e-2);
    BOOST_TEST(e.worst <= 0.25);
    BOOST_TEST(e.worst > 0.0);
}

BOOST_AUTO_TEST_CASE(engine_tokens_and_logprobs_match_the_cpu, *utf::precondition(need_gpu)) {
    const model::Model m = host_model("tiny");
    const std::vector<runtime::Finished> cpu = run_engine(m, nullptr);
    const auto dm = device_model(m, DType::f32);
    const std::vector<runtime::Finished> gpu = run_engine(m, dm.get());
    BOOST_REQUIRE_EQUAL(gpu.size(), cpu.size());
    for (size_t i = 0; i < gpu.size(); ++i) {
        BOOST_TEST_CONTEXT("request " << cpu[i].index) {
            BOOST_TEST(gpu[i].index == cpu[i].index);
            BOOST_TEST(gpu[i].tokens == cpu[i].tokens, boost::test_tools::per_element());
            BOOST_TEST(gpu[i].greedy_token == cpu[i].greedy_token);
            BOOST_TEST((gpu[i].finish == cpu[i].finish));
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

BOOST_AUTO_TEST_CASE(decode_graphs_match_eager_steps, *utf::precondition(need_gpu)) {
    // (first sequence, count): buckets 4, 1, 8, 16, 4; key buckets 256, 512, 256, 512, 256
    const std::vector<std::pair<int, int>> steps = {{1, 3}, {0, 1}, {2, 5}, {0, 16}, {1, 3}};
    for (const std::string& name :
         {std::string("tiny-kimi"), std::string("tiny"), std::string("tiny-deepseek")}) {
        BOOST_TEST_CONTEXT(name) {
            const model::Model m = graph_model(name);
            auto new_pool = [&](model::DeviceModel& dev, bool host_tier = false) {
                return std::make_unique<model::KvPool>(m.local,
                                                       m.shard,
                                                       kPageTokens,
                                                       256,
                                                       [&dev, host_tier](const model::KvLayout& l) {
                                                           return host_tier ? dev.host_kv_store(l)
                                                                            : dev.kv_store(l);
                                                       });
            };
            const auto eager = graph_device(m, false);
            const auto graphs = graph_device(m, true);
            std::vector<std::vector<int64_t>> want_tokens, got_tokens;
            const auto eager_pool = new_pool(*eager);
            const std::vector<Buffer> want =
                run_decodes(m, *eager, *eager_pool, steps, want_tokens);
            const auto first_pool = new_pool(*graphs);
            const std::vector<Buffer> got = run_decodes(m, *graphs, *first_pool, steps, got_tokens);
            model::DecodeGraphCounters c = graphs->graph_counters();
            BOOST_TEST(eager->graph_counters().graph_steps == 0);
            BOOST_TEST(c.graph_steps == 5);
            BOOST_TEST(c.warmups == 4);
            BOOST_TEST(c.captures == 4);
            auto compare = [&](const std::vector<Buffer>& run,
                               const std::vector<std::vector<int64_t>>& tokens) {
                BOOST_REQUIRE_EQUAL(tokens.size(), want_tokens.size());
                for (size_t q = 0; q < tokens.size(); ++q)
                    BOOST_TEST(tokens[q] == want_tokens[q], boost::test_tools::per_element());
                BOOST_REQUIRE_EQUAL(run.size(), want.size());
                for (size_t k = 0; k < run.size(); ++k) {
                    BOOST_REQUIRE((run[k].view().shape == want[k].view().shape));
                    const double rel =
                        rel_error(run[k].ptr<float>(), want[k].ptr<float>(), run[k].view().numel());
                    BOOST_TEST_MESSAGE(name << " decode step " << k
                                            << ": graph vs eager logits rel " << rel);
                    BOOST_TEST(rel <= 1e-6);
                }
            };
            compare(got, got_tokens);

            // another store of the same geometry (the first still alive, so elsewhere): the
            // graphs are re-captured for its pages, nothing new is warmed up or captured
            const auto second_pool = new_pool(*graphs);
            const std::vector<Buffer> again =
                run_decodes(m, *graphs, *second_pool, steps, got_tokens);
            c = graphs->graph_counters();
            BOOST_TEST(c.graph_steps == 10);
            BOOST_TEST(c.warmups == 4);
            BOOST_TEST(c.captures == 4);
            BOOST_TEST(c.refreshes == 4);
            BOOST_TEST(c.resets == 0);
            compare(again, got_tokens);

            // pages in the host tier: not plainly resident, so every step runs eagerly (its
            // results are the resident pages' bit for bit)
            const auto host_pool = new_pool(*graphs, true);
            const std::vector<Buffer> hosted =
                run_decodes(m, *graphs, *host_pool, steps, got_tokens);
            BOOST_TEST(graphs->graph_counters().graph_steps == 10);
            compare(hosted, got_tokens);
        }
    }
}

bool same_bits(const Buffer& a, const Buffer& b) {
    return a.view().shape == b.view().shape &&
           std::memcmp(a.view().data, b.view().data, a.view().bytes()) == 0;
}

BOOST_AUTO_TEST_CASE(host_kv_tier_gives_the_resident_results_bit_for_bit,
                     *utf::precondition(need_gpu)) {
    const std::vector<std::pair<std::string, DType>> cases = {
        {"tiny", DType::f32},
        {"tiny-deepseek", DType::f32},
        {"tiny-mixed", DType::f32},
        {"tiny-mixed", DType::bf16},
    };
    for (const auto& [name, dtype] : cases) {
        BOOST_TEST_CONTEXT(name << " " << to_string(dtype)) {
            const model::Model m = host_model(name);
            std::vector<std::vector<int64_t>> fed;
            std::vector<float> cpu_rows, host_rows;
            run_plan(
                {m, nullptr, model::KdaMode::recurrent, model::AttnMode::absorbed}, fed, &cpu_rows);
            const auto dm = device_model(m, dtype);
            const std::vector<Buffer> resident = run_plan({m, dm.get()}, fed);
            const std::vector<Buffer> host =
                run_plan({m, dm.get(), model::KdaMode::automatic, model::AttnMode::automatic, true},
                         fed,
                         &host_rows);
            BOOST_REQUIRE_EQUAL(host.size(), resident.size());
            for (size_t k = 0; k < host.size(); ++k)
                BOOST_TEST_CONTEXT("step " << k) {
                    BOOST_TEST(same_bits(host[k], resident[k]));
                }
            BOOST_REQUIRE_EQUAL(host_rows.size(), cpu_rows.size());
            if (dtype == DType::f32) {  // bf16 rows move with routing flips (see above)
                const double rel = rel_error(
                    host_rows.data(), cpu_rows.data(), static_cast<int64_t>(host_rows.size()));
                BOOST_TEST_MESSAGE(name << ": host rows relative to the CPU's: " << rel);
                BOOST_TEST(rel <= 1e-5);
            }
        }
    }
}

BOOST_AUTO_TEST_CASE(host_kv_tier_engine_matches_the_resident_engine,
                     *utf::precondition(need_gpu)) {
    const model::Model m = host_model("tiny-deepseek");
    const auto dm = device_model(m, DType::f32);
    const std::vector<runtime::Finished> resident = run_engine(m, dm.get());
    const std::vector<runtime::Finished> host = run_engine(m, dm.get(), true);
    BOOST_REQUIRE_EQUAL(host.size(), resident.size());
    for (size_t i = 0; i < host.size(); ++i) {
        BOOST_TEST_CONTEXT("request " << resident[i].index) {
            BOOST_TEST(host[i].tokens == resident[i].tokens, boost::test_tools::per_element());
            BOOST_TEST(host[i].logprobs == resident[i].logprobs, boost::test_tools::per_element());
            BOOST_TEST(host[i].prompt_logprobs == resident[i].prompt_logprobs,
                       boost::test_tools::per_element());
        }
    }
}

BOOST_AUTO_TEST_SUITE_END()
