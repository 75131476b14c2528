// The plan (runtime/plan.h): weights per rank by block worked out by hand for the tiny preset at
// (tp, ep) = (1, 1) and (2, 2); the plan's sums equal model::count_params exactly for every preset
// and shipped config; weights per rank × ranks = each weight times its copies; KV pages, KDA
// states, tp and ep bytes, LoRA state and FLOPs per token by hand; the layout search's best and its
// rejection reasons on a small case; the flagship finds a fitting layout on 512 H200s.
#include <cmath>
#include <cstdio>
#include <map>
#include <string>

#include <boost/test/unit_test.hpp>

#include "hymoe/deck/deck.h"
#include "hymoe/model/config.h"
#include "hymoe/runtime/job.h"
#include "hymoe/runtime/plan.h"

namespace rt = hymoe::runtime;
using hymoe::deck::Deck;
using hymoe::model::ModelConfig;
using hymoe::parallel::Layout;
using rt::PlanBlock;

namespace {

const std::string kKimi = "inputs/models/kimi-linear-48b-a3b/config.json";
const std::string kDeepSeek = "inputs/models/deepseek-v3.2/config.json";

// A plan deck with the struct defaults (inference 64 sequences, 8192-token prompts, 64 new
// tokens, chunks of 2048, auto pages of 64; an H200 node).
Deck plan_deck(hymoe::DType dtype = hymoe::DType::bf16) {
    Deck d;
    d.job.kind = hymoe::deck::JobKind::plan;
    d.model.dtype = dtype;
    d.inference.kv_dtype = dtype;  // kv_cache.dtype's default
    return d;
}

int64_t block(const rt::StagePlan& s, PlanBlock b) {
    return s.params[static_cast<size_t>(b)];
}

int64_t sum_over_ranks(const rt::Plan& p) {
    int64_t n = 0;
    for (const rt::StagePlan& s : p.stages)
        n += s.weight_params() * p.layout.tp * p.layout.dp;
    return n;
}

double rel_diff(double a, double b) {
    return std::abs(a - b) / b;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(plan)

// tiny (model-math §13): d 64, V 256, layers KKKG / -EEE. By hand, per layer:
//   KDA (H 4, K 16, D 64, W 4): 3Dd 12288 + 3DW 768 + f_a 1024 + f_b 1024 + dt 64 + A 4 + b 256
//       + g_a 1024 + g_b 1024 + o_norm 16 + o_proj 4096 = 21588 (×3 = 64764)
//   gated MLA (H 4, r_q 32, r_kv 32, 16+8, v 16): wq_a 2048 + q_norm 32 + wq_b 3072 + wkv_a 2560
//       + kv_norm 32 + wkv_b 4096 + o 4096 + gate 4096 = 20032
//   indexer (16 × 16): wq_b 8192 + wk 1024 + k_norm 32 + weights_proj 1024 = 10272
//   dense 3·64·128 = 24576; MoE ×3: router 512 + bias 8, shared 6144, experts 8 × 6144 = 49152
//   norms 4·128 + 64 = 576; embedding = head = 16384; vision 45600. Total 366036.
BOOST_AUTO_TEST_CASE(tiny_weights_by_hand_at_one_rank) {
    ModelConfig m = hymoe::model::preset_config("tiny");
    rt::Plan p = rt::make_plan(m, Layout{1, 1, 1, 1, 1}, plan_deck(hymoe::DType::f32));
    BOOST_REQUIRE(p.stages.size() == 1u);
    const rt::StagePlan& s = p.stages[0];
    BOOST_TEST(block(s, PlanBlock::embedding) == 16384);
    BOOST_TEST(block(s, PlanBlock::head) == 16384);
    BOOST_TEST(block(s, PlanBlock::kda) == 64764);
    BOOST_TEST(block(s, PlanBlock::mla) == 20032);
    BOOST_TEST(block(s, PlanBlock::indexer) == 10272);
    BOOST_TEST(block(s, PlanBlock::dense_ffn) == 24576);
    BOOST_TEST(block(s, PlanBlock::router) == 1560);
    BOOST_TEST(block(s, PlanBlock::shared_experts) == 18432);
    BOOST_TEST(block(s, PlanBlock::routed_experts) == 147456);
    BOOST_TEST(block(s, PlanBlock::latent_proj) == 0);
    BOOST_TEST(block(s, PlanBlock::norms) == 576);
    BOOST_TEST(block(s, PlanBlock::vision) == 45600);
    BOOST_TEST(s.weight_params() == 366036);
    BOOST_TEST(s.mem.weights == 366036.0 * 4);  // fp32
}

// (tp, ep) = (2, 2), dp 1: split parts halve, replicated parts stay whole:
//   KDA (19524 / 2 + 2064) × 3 = 35478; MLA 15360 / 2 + 4672 = 12352; indexer 9216 / 2 + 1056
//   = 5664; dense 12288; router 1560 (replicated); shared 9216; experts 4 per rank = 73728;
//   embedding = head = 8192; norms 576 and vision 45600 replicated. 212846 per rank.
BOOST_AUTO_TEST_CASE(tiny_weights_by_hand_at_tp2_ep2) {
    ModelConfig m = hymoe::model::preset_config("tiny");
    rt::Plan p = rt::make_plan(m, Layout{2, 1, 1, 2, 1}, plan_deck());
    const rt::StagePlan& s = p.stages[0];
    BOOST_TEST(block(s, PlanBlock::embedding) == 8192);
    BOOST_TEST(block(s, PlanBlock::head) == 8192);
    BOOST_TEST(block(s, PlanBlock::kda) == 35478);
    BOOST_TEST(block(s, PlanBlock::mla) == 12352);
    BOOST_TEST(block(s, PlanBlock::indexer) == 5664);
    BOOST_TEST(block(s, PlanBlock::dense_ffn) == 12288);
    BOOST_TEST(block(s, PlanBlock::router) == 1560);
    BOOST_TEST(block(s, PlanBlock::shared_experts) == 9216);
    BOOST_TEST(block(s, PlanBlock::routed_experts) == 73728);
    BOOST_TEST(block(s, PlanBlock::norms) == 576);
    BOOST_TEST(block(s, PlanBlock::vision) == 45600);
    BOOST_TEST(s.weight_params() == 212846);
    // Both ranks: every weight once (366036) + a second copy of the replicated ones: KDA 3·2064,
    // MLA 4672, indexer 1056, router 1560, norms 576, vision 45600 = 59656.
    BOOST_TEST(sum_over_ranks(p) == 366036 + 59656);
    // bf16: the vectors held in fp32 at any dtype (model/weights.h) at 4 bytes, the rest at 2:
    // KDA (3DW 768 + dt 64 + A 4) / 2 + o_norm 16 = 434 (×3 = 1302), MLA q_norm 32 + kv_norm 32 +
    // indexer k_norm 32 = 96, router 1560, norms 576: 3534 (the vision tower counts at 2).
    BOOST_TEST(s.f32_params == 3534);
    BOOST_TEST(s.mem.weights == (212846.0 - 3534) * 2 + 3534.0 * 4);
}

BOOST_AUTO_TEST_CASE(plan_sums_equal_count_params_exactly) {
    std::map<std::string, ModelConfig> models;
    for (const std::string& name : hymoe::model::preset_names())
        models[name] = hymoe::model::preset_config(name);
    models["kimi"] = hymoe::model::load_model_config(kKimi);
    models["deepseek"] = hymoe::model::load_model_config(kDeepSeek);
    for (const auto& [name, m] : models) {
        BOOST_TEST_CONTEXT(name) {
            hymoe::model::ParamCount pc = hymoe::model::count_params(m);
            rt::Plan p = rt::make_plan(m, Layout{1, 1, 1, 1, 1}, plan_deck());
            BOOST_TEST(p.stages[0].weight_params() == pc.total);
            BOOST_TEST(p.total_params == pc.total);
            BOOST_TEST(p.active_params == pc.active);
            int64_t sum = 0;
            for (int64_t n : p.model_params)
                sum += n;
            BOOST_TEST(sum == pc.total);
        }
    }
    // The published sizes (tolerances and their reasons: tests/unit/model/test_config.cpp).
    rt::Plan k = rt::make_plan(models["kimi"], Layout{1, 1, 1, 1, 1}, plan_deck());
    BOOST_TEST(rel_diff(static_cast<double>(k.total_params), 48e9) < 0.03);
    BOOST_TEST(rel_diff(static_cast<double>(k.active_params), 3e9) < 0.17);
    rt::Plan d = rt::make_plan(models["deepseek"], Layout{1, 1, 1, 1, 1}, plan_deck());
    BOOST_TEST(rel_diff(static_cast<double>(d.total_params), 671e9) < 0.01);
    BOOST_TEST(rel_diff(static_cast<double>(d.active_params), 37e9) < 0.05);
    rt::Plan f = rt::make_plan(models["flagship-2.8t"], Layout{1, 1, 1, 1, 1}, plan_deck());
    BOOST_TEST(rel_diff(static_cast<double>(f.total_params), 2.8e12) < 0.02);
}

// With tp = 1 every dense weight has dp copies and every expert edp copies; pipeline stages hold
// disjoint layers, so at dp = ep = 1 the stages add up to the model exactly.
BOOST_AUTO_TEST_CASE(weights_per_rank_times_ranks_equal_the_copies) {
    struct Case {
        std::string model;
        Layout l;
    };
    const Case cases[] = {{kDeepSeek, {1, 8, 4, 8, 1}},
                          {kDeepSeek, {1, 1, 4, 1, 1}},
                          {kDeepSeek, {1, 16, 2, 4, 1}},
                          {kKimi, {1, 4, 3, 2, 1}},
                          {kKimi, {1, 2, 27, 2, 1}}};
    for (const Case& c : cases) {
        BOOST_TEST_CONTEXT(c.model << " dp " << c.l.dp << " pp " << c.l.pp << " ep " << c.l.ep
                                   << " etp " << c.l.etp) {
            ModelConfig m = hymoe::model::load_model_config(c.model);
            BOOST_REQUIRE(!rt::model_layout_problem(m, c.l));
            rt::Plan p = rt::make_plan(m, c.l, plan_deck());
            BOOST_TEST(p.stages.size() == static_cast<size_t>(c.l.pp));
            const int64_t routed = p.model_params[static_cast<size_t>(PlanBlock::routed_experts)];
            BOOST_TEST(sum_over_ranks(p) ==
                       c.l.dp * (p.total_params - routed) + c.l.edp() * routed);
            int64_t layers = 0;
            for (const rt::StagePlan& s : p.stages)
                layers += s.n_layer;
            BOOST_TEST(layers == static_cast<int64_t>(m.layers.size()));
        }
    }
}

// KV pages by hand. tiny: one gated DSA layer caching r_kv 32 + d_r 8 + d_I 16 = 56 values a
// token (bf16: 112 bytes); 2 sequences × context 100 + 28 = 128 → 2 pages of 64 each → 256 tokens
// = 28672 bytes. KDA state per sequence and layer: fp32 [4, 16, 16] + 3 tails [3, 64] = 6400
// bytes, × 2 sequences × 3 layers = 38400; at tp 2 the heads halve (19200), the latent cache is
// replicated (28672).
BOOST_AUTO_TEST_CASE(kv_pages_and_kda_states_by_hand) {
    ModelConfig m = hymoe::model::preset_config("tiny");
    Deck d = plan_deck();
    d.inference.max_seqs = 2;
    d.inference.max_tokens = 100;
    d.inference.prefill_chunk = 50;
    d.inference.max_new_tokens = 28;
    rt::Plan p = rt::make_plan(m, Layout{1, 1, 1, 1, 1}, d);
    BOOST_TEST(p.work.context == 128);
    BOOST_TEST(p.work.pages == 4);
    BOOST_TEST(p.stages[0].mem.kv_cache == 28672.0);
    BOOST_TEST(p.stages[0].mem.kda_state == 38400.0);
    rt::Plan t = rt::make_plan(m, Layout{2, 1, 1, 1, 1}, d);
    BOOST_TEST(t.stages[0].mem.kv_cache == 28672.0);
    BOOST_TEST(t.stages[0].mem.kda_state == 19200.0);
    d.inference.pages = 10;  // explicit pages: 640 tokens
    BOOST_TEST(rt::make_plan(m, Layout{1, 1, 1, 1, 1}, d).stages[0].mem.kv_cache == 640.0 * 112);
    // pp 2: the DSA layer (layer 3) and its pages are on stage 1 only
    d.inference.pages = 0;
    rt::Plan s = rt::make_plan(m, Layout{1, 1, 2, 1, 1}, d);
    BOOST_TEST(s.stages[0].mem.kv_cache == 0.0);
    BOOST_TEST(s.stages[1].mem.kv_cache == 28672.0);
    BOOST_TEST(s.stages[0].mem.kda_state == 2.0 * 2 * 6400);
    // kv_cache.dtype fp32: twice the bytes of bf16 pages; the KDA state stays fp32
    d.inference.kv_dtype = hymoe::DType::f32;
    rt::Plan f = rt::make_plan(m, Layout{1, 1, 1, 1, 1}, d);
    BOOST_TEST(f.stages[0].mem.kv_cache == 2 * 28672.0);
    BOOST_TEST(f.stages[0].mem.kda_state == 38400.0);
}

// DeepSeek-V3.2 at pp 61 puts one DSA layer on each stage: 512 + 64 + 128 = 704 bf16 values
// (1408 bytes) a token; 4 sequences of 4096 tokens = 64 pages each = 16384 tokens.
BOOST_AUTO_TEST_CASE(one_deepseek_attention_layer_by_hand) {
    ModelConfig m = hymoe::model::load_model_config(kDeepSeek);
    Deck d = plan_deck();
    d.inference.max_seqs = 4;
    d.inference.max_tokens = 4096;
    d.inference.max_new_tokens = 0;
    rt::Plan p = rt::make_plan(m, Layout{1, 1, 61, 1, 1}, d);
    BOOST_TEST(p.work.pages == 256);
    for (const rt::StagePlan& s : p.stages)
        BOOST_TEST(s.mem.kv_cache == 16384.0 * 1408);
}

// tp all-reduce of one decode step, tiny at tp 2 (ring factor 2(tp−1)/tp = 1), 64 sequences of
// 2048-token prompts + 64 new, bf16: 4 layers × 2 all-reduces of [64, 64] (65536 bytes) + the
// embedding's (8192) + the DSA index scores [64, 2080] fp32 (average context 2048 + 64/2) =
// 532480 → 606208 bytes.
// ep of one decode step, tiny at dp 2, ep 2: a token's 2 of 8 experts reach
// u = 2·(1 − C(4,2)/C(8,2)) = 11/7 ep ranks; dispatch + combine move 2·64·u·(1 − 1/2) rows of 64
// bf16 values per MoE layer, × 3 layers.
BOOST_AUTO_TEST_CASE(tp_and_ep_bytes_of_a_decode_step_by_hand) {
    ModelConfig m = hymoe::model::preset_config("tiny");
    Deck d = plan_deck();
    d.inference.max_tokens = 2048;  // tiny's max_position is 4096
    rt::Plan t = rt::make_plan(m, Layout{2, 1, 1, 1, 1}, d);
    BOOST_TEST(t.decode.tokens == 64);
    BOOST_TEST(t.decode.context == 2080);
    BOOST_TEST(t.decode.comm_bytes[static_cast<size_t>(rt::PlanPhase::tp)] == 606208.0);
    rt::Plan e = rt::make_plan(m, Layout{1, 2, 1, 2, 1}, d);
    BOOST_TEST(e.experts_reached == 11.0 / 7.0, boost::test_tools::tolerance(1e-12));
    const double ep = 3 * 2 * 64 * (11.0 / 7.0) * 0.5 * 64 * 2;
    BOOST_TEST(e.decode.comm_bytes[static_cast<size_t>(rt::PlanPhase::ep)] == ep,
               boost::test_tools::tolerance(1e-12));
    BOOST_TEST(e.decode.comm_bytes[static_cast<size_t>(rt::PlanPhase::tp)] == 0.0);
}

// Forward FLOPs of a tiny token at the average decode context 2048 + 64/2 = 2080:
// 2·(active 209844 − embedding 16384) = 386920, KDA 3 × 8·4·16·16 = 24576, DSA scores and values
// 2·4·8·(16+8+16) = 2560 (top-8), indexer 2·16·16·2080 = 1064960. The prefill average (context
// 1024) differs only in the indexer term: 524288.
BOOST_AUTO_TEST_CASE(flops_per_token_by_hand) {
    ModelConfig m = hymoe::model::preset_config("tiny");
    Deck d = plan_deck();
    d.inference.max_tokens = 2048;
    rt::Plan p = rt::make_plan(m, Layout{1, 1, 1, 1, 1}, d);
    BOOST_TEST(p.flops_per_token_decode == 386920.0 + 24576 + 2560 + 1064960);
    BOOST_TEST(p.flops_per_token_prefill == 386920.0 + 24576 + 2560 + 524288);
}

// LoRA rank 4 on q_proj at tp 1: KDA q_proj [64, 64] → 4·64 + 64·4 = 512 (×3 layers), MLA wq_b
// [96, 32] → 4·32 + 96·4 = 512: 2048 fp32 parameters; grads the same, AdamW twice that. dp 2
// all-reduces the 8192 gradient bytes once a step (ring: 2·(1/2)·8192). Recompute keeps less.
BOOST_AUTO_TEST_CASE(lora_training_state_by_hand) {
    ModelConfig m = hymoe::model::preset_config("tiny");
    Deck d = plan_deck();
    d.job.kind = hymoe::deck::JobKind::lora;
    d.finetune.present = true;
    d.finetune.lora.rank = 4;
    d.finetune.lora.target_modules = {"q_proj"};
    d.finetune.micro_batch = 2;
    d.finetune.seq_len = 256;
    d.finetune.grad_accum = 4;
    rt::Plan p = rt::make_plan(m, Layout{1, 2, 1, 1, 1}, d);
    BOOST_TEST(p.work.training_primary);
    BOOST_TEST(!p.work.inference);
    const rt::StageMemory& mem = p.stages[0].mem;
    BOOST_TEST(p.stages[0].lora_params == 2048);
    BOOST_TEST(mem.lora == 8192.0);
    BOOST_TEST(mem.lora_grads == 8192.0);
    BOOST_TEST(mem.adam == 16384.0);
    BOOST_TEST(mem.act_train_recompute < mem.act_train);
    BOOST_TEST(mem.training == mem.weights + mem.act_train + 32768.0 + mem.reserve);
    BOOST_TEST(p.train.comm_bytes[static_cast<size_t>(rt::PlanPhase::dp)] == 8192.0);
    BOOST_TEST(p.train.tokens == 4 * 2 * 256);
    BOOST_TEST(p.seconds_per_token == p.train.total / (2.0 * 4 * 2 * 256));
    d.finetune.recompute = true;
    rt::Plan r = rt::make_plan(m, Layout{1, 2, 1, 1, 1}, d);
    BOOST_TEST(r.stages[0].mem.training < mem.training);
    BOOST_TEST(r.train.flops == p.train.flops * 1.5,
               boost::test_tools::tolerance(1e-12));  // a third forward pass
}

// tiny on 8 GPUs: tp 8 breaks the 4 attention heads (10 layouts: ep·etp over the 8 ranks of a
// stage), pp 8 exceeds the 4 layers (1 layout), etp not dividing tp rejects 15 (tp·dp·pp = 8 with
// tp < 8 and pp ≤ 4, ep·etp dividing tp·dp, etp ∤ tp); every other layout passes the rules. With
// links of 1 MB/s any communication dominates, so the best is the one layout with none: pure dp.
BOOST_AUTO_TEST_CASE(search_finds_the_expected_best_and_rejection_reasons) {
    ModelConfig m = hymoe::model::preset_config("tiny");
    Deck d = plan_deck();
    d.hardware.nvlink_gb_s = 1e-3;
    d.hardware.ib_gbit_s = 8e-3;
    rt::LayoutSearch s = rt::search_layouts(m, d, 8);
    BOOST_REQUIRE(!s.fitting.empty());
    const Layout& best = s.fitting.front().layout;
    BOOST_TEST((best.tp == 1 && best.pp == 1 && best.dp == 8 && best.ep == 1 && best.etp == 1));
    BOOST_REQUIRE(s.best.has_value());
    BOOST_TEST(s.best->seconds_per_token == s.fitting.front().seconds_per_token);
    std::map<std::string, int> reasons(s.reasons.begin(), s.reasons.end());
    BOOST_TEST(reasons.size() == 3u);
    BOOST_TEST(reasons["tp does not divide the attention heads"] == 10);
    BOOST_TEST(reasons["pp exceeds the layers"] == 1);
    BOOST_TEST(reasons["etp does not divide tp"] == 15);
    for (const rt::LayoutCandidate& c : s.rejected)
        if (c.layout.tp == 8)
            BOOST_TEST(c.reason ==
                       "parallel.tp: 8 does not divide the attention heads = 4 (tp splits the "
                       "MLA/DSA heads)");
    for (size_t i = 1; i < s.fitting.size(); ++i)
        BOOST_TEST(s.fitting[i - 1].seconds_per_token <= s.fitting[i].seconds_per_token);
    BOOST_TEST(s.fitting.size() + s.rejected.size() == 65u);
}

// Memory as the binding constraint: with room for pp 1's peak but not tp 1 x pp 1's, the
// layouts above it are rejected with "memory X GiB > C GiB" and the rest fit.
BOOST_AUTO_TEST_CASE(search_rejects_by_memory_with_the_numbers) {
    ModelConfig m = hymoe::model::load_model_config(kKimi);
    Deck d = plan_deck();
    const double full = rt::make_plan(m, Layout{1, 1, 1, 1, 1}, d).peak_bytes;
    const double split = rt::make_plan(m, Layout{1, 1, 8, 1, 1}, d).peak_bytes;
    BOOST_REQUIRE(split < full);
    d.hardware.gpu_memory_gb = std::floor((split + full) / 2 / 1e9);
    rt::LayoutSearch s = rt::search_layouts(m, d, 8);
    char gib[32];  // the capacity in GiB, as the plan reports memory
    std::snprintf(gib, sizeof gib, "%.1f", d.hardware.gpu_memory_gb * 1e9 / (1 << 30));
    const std::string rule = "memory > " + std::string(gib) + " GiB";
    bool saw_memory = false;
    for (const rt::LayoutCandidate& c : s.rejected) {
        if (c.rule != rule)
            continue;
        saw_memory = true;
        BOOST_TEST(c.peak_bytes > d.hardware.gpu_memory_gb * 1e9);
        BOOST_TEST(c.reason.rfind("memory ", 0) == 0u);
        BOOST_TEST(c.reason.find(" GiB > ") != std::string::npos);
    }
    BOOST_TEST(saw_memory);
    for (const rt::LayoutCandidate& c : s.fitting)
        BOOST_TEST(c.peak_bytes <= d.hardware.gpu_memory_gb * 1e9);
    bool full_rejected = false;
    for (const rt::LayoutCandidate& c : s.rejected)
        full_rejected |=
            c.layout.tp == 1 && c.layout.pp == 1 && c.layout.ep == 1 && c.layout.etp == 1;
    BOOST_TEST(full_rejected);
}

BOOST_AUTO_TEST_CASE(flagship_at_512_h200s_finds_a_fitting_layout) {
    const std::string path = "jobs/plan-flagship/deck.yaml";
    Deck d = hymoe::deck::parse_deck(hymoe::deck::read_deck_file(path), path, {});
    BOOST_TEST(d.plan.gpus == 512);
    ModelConfig m = hymoe::model::preset_config(d.model.preset);
    rt::Plan one = rt::make_plan(m, Layout{1, 1, 1, 1, 1}, d);
    BOOST_TEST(!one.fits);  // 5.7 TB of bf16 weights
    rt::LayoutSearch s = rt::search_layouts(m, d, 512);
    BOOST_REQUIRE(!s.fitting.empty());
    BOOST_REQUIRE(s.best.has_value());
    BOOST_TEST(s.best->fits);
    BOOST_TEST(s.best->peak_bytes <= 141e9);
    BOOST_TEST(s.best->layout.world() == 512);
    BOOST_TEST(s.best->seconds_per_token > 0.0);
    // the whole model once over the 512 GPUs' weights: Σ per rank ≥ total
    BOOST_TEST(sum_over_ranks(*s.best) >= s.best->total_params);
}

BOOST_AUTO_TEST_SUITE_END()
