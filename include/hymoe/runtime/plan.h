// The plan (DESIGN.md "Job kinds": plan): per-rank memory, per-step communication, FLOPs and a
// time estimate for one layout, and the search over layouts for a GPU count. Arithmetic only:
// nothing is allocated, so a 2.8T-parameter model plans on a laptop.
//
// Symmetry. Every rank of a pipeline stage has the same plan: tp ranks hold equal slices, dp
// replicas are copies, and every ep rank hosts E/ep experts each split over etp, so token loads
// are equal under the balanced-routing assumption below. A plan is one StagePlan per stage.
//
// Sharding (the rules the runtime follows; runtime/job.h checks the divisibility):
//   embedding [V,d] and LM head [V,d]: vocab-parallel over tp; embedding on stage 0, head and final
//     norm on the last stage (a tied head keeps a copy of the embedding there when pp > 1).
//   KDA: everything with a head dimension (q/k/v, convs, f_b, g_b, dt_bias, A_log, b_proj, o_proj)
//     over tp; the low-rank down projections f_a, g_a and o_norm replicated.
//   MLA/DSA: wq_b (or q_proj), wkv_b, o_proj and the output gate over tp (heads); wq_a, q_norm,
//     wkv_a and kv_norm replicated. Indexer: wq_b and weights_proj over tp (indexer heads), wk and
//     k_norm replicated; its partial index scores are all-reduced over tp (fp32).
//   dense FFN and shared experts: over tp (width). Router and latent projections: replicated; each
//     tp rank routes and projects its 1/tp share of the tokens, which it then dispatches, so the ep
//     group sees every token once (Megatron's dispatcher with sequence-split tokens).
//   routed experts: E/ep per rank, each split over etp (width), replicated over edp.
//   block norms: replicated. vision tower: stage 0, replicated (its weights are planned; the
//     compute and activations of images are not: the workloads below are text tokens).
//
// Workloads, per dp replica (each replica is an independent engine; deck batch sizes are per
// replica). Inference: B = batch.max_seqs sequences; prompt budget P = batch.max_tokens (the deck
// has no separate prompt-length key: batch.max_tokens bounds the tokens of a batch step and so the
// longest prompt one step can take), G = max_new_tokens, context C = min(P + G, max_position);
// prefill in chunks of T = batch.prefill_chunk. KV pages: kv_cache.pages, or (auto) B·⌈C/page⌉.
// Training (a finetune section): micro-batches of micro_batch × seq_len tokens, grad_accum of them
// per step, 1F1B pipeline schedule (stage s holds min(pp − s, grad_accum) micro-batches).
//
// Memory per rank. Weights, activations and KV pages in model.dtype; KDA states, scores, router
// probabilities and logits in fp32; LoRA A/B, their gradients and AdamW m, v in fp32 (16 bytes a
// parameter). Activations: the residual stream (3 rows of d) + the largest single block working set
// on the stage (all its intermediates live at once; attention is flash-style, its scores tiled and
// never whole, but DSA holds the chunk's index scores over the whole context [T, P] fp32 for its
// top-k; MoE dispatch and combine buffers with the top-k expansion) + fp32 logits. Training saves
// per layer the tensors its backward reads (attention: only the log-sum-exp of the scores; the
// indexer is detached); with recompute only each layer's input plus one layer's saved set. A fixed
// runtime reserve of 2 GB (CUDA context, NCCL buffers, allocator slack) is added.
//
// Communication per rank (bytes sent). tp: ring all-reduces (2(tp−1)/tp of the buffer) of the
// mixer and FFN outputs [n, d] (2 a layer), of the vocab-parallel embedding rows, and of the DSA
// index scores [n, context] fp32; training adds the backward's (and recompute's) passes. ep:
// dispatch + combine below. pp: the activations [n, d] to the next stage (training: the gradients
// back too). dp: the LoRA gradients once a training step.
// MoE traffic. Routing is taken as uniform and balanced: a token's top-k experts reach
// u = ep·(1 − C(E − E/ep, k)/C(E, k)) distinct ep ranks (a token goes once to each rank that hosts
// any of its experts). Each tp rank's etp block owns etp·n/tp of the tokens, and every rank of the
// block sends them to the u ep ranks of its own etp slice (model/moe_parallel.h), a fraction 1/ep
// of those rows to itself: dispatch and combine each move etp·u·(1 − 1/ep) rows of width d (or ℓ
// for latent MoE) per token of the rank's 1/tp share to other GPUs.
//
// Time model (state it wherever a time is printed): per stage and micro-batch,
//   t = max(t_compute, t_hbm) + t_tp + t_ep + t_pp,
// t_compute = FLOPs / tflops, t_hbm = (weights read (untouched experts skipped) + KV and KDA state
// read/written) / hbm_tb_s, each collective = its bytes / the link bandwidth: NVLink when the group
// lies inside one node (gpus_per_node consecutive ranks), else InfiniBand at
// ib_gbit_s·ib_links/8/gpus_per_node per GPU (an all-to-all splits its bytes by where the peers
// are). Peak rates, no overlap of communication with compute, no efficiency factors: a lower
// bound. Pipeline: prefill chunks and decode micro-batches stream through the stages with no
// bubble, so a prefill chunk takes the slowest stage's time and a decode step of the B sequences
// (split into m = min(pp, B) micro-batches) takes pp × the slowest stage's time for B/m sequences;
// training takes (grad_accum + pp − 1) × the slowest stage's forward + backward time, plus the dp
// all-reduce of the LoRA gradients. FLOPs: 2 per weight a token uses (the embedding lookup is
// free) + attention (MLA/DSA scores and values over the context (DSA: its top-k), indexer scores
// over the whole context, KDA recurrence 8·H·K·V); backward of a frozen base = one more forward
// (input gradients only), recompute adds a forward. Timing contexts are averages (prefill P/2,
// decode P + G/2); memory uses the worst case (P, C).
// Ranking: time per token of the whole job, the primary workload's step time divided by the
// tokens all dp replicas process in it (inference: prefill of B prompts + G decode steps).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "hymoe/deck/deck.h"
#include "hymoe/model/config.h"
#include "hymoe/model/weights.h"
#include "hymoe/parallel/grid.h"

namespace hymoe::io {
class H5Writer;
}

namespace hymoe::runtime {

struct Job;

// Weight groups, in the order of the log's table and of /plan/blocks: the block each tensor of
// the weight list names (model/weights.h WeightBlock: embedding, head, kda, mla, indexer,
// dense_ffn, router, routed_experts, shared_experts, latent_proj, norms, vision).
using PlanBlock = model::WeightBlock;
constexpr int kPlanBlocks = 12;
const char* to_string(PlanBlock b);

// Step phases, in the order of /plan/phases.
enum class PlanPhase { compute, hbm, tp, ep, pp, dp };
constexpr int kPlanPhases = 6;
const char* to_string(PlanPhase p);

using PhaseArray = std::array<double, kPlanPhases>;

// One step of one stage (a micro-batch through its layers) or of the whole pipeline.
struct StepPlan {
    int64_t tokens = 0;       // tokens per dp replica in the step
    int64_t context = 0;      // attention context the step's queries see (average for timing)
    double flops = 0;         // per rank
    double hbm_bytes = 0;     // per rank: weights read + KV / state traffic
    PhaseArray comm_bytes{};  // per rank sent, for tp, ep, pp, dp (compute/hbm entries 0)
    PhaseArray seconds{};     // per phase
    double total = 0;         // max(compute, hbm) + Σ comm, seconds
    PlanPhase dominant = PlanPhase::compute;
};

// Bytes per rank.
struct StageMemory {
    double weights = 0;
    double kv_cache = 0;  // on the GPU
    double kv_host = 0;   // offloaded pages (kv_cache.offload), not counted in the total
    double kda_state = 0;
    double act_prefill = 0;  // one prefill chunk (worst case: the chunk at the end of the prompt)
    double act_decode = 0;   // one decode step of B sequences at context C
    double act_train = 0;    // training activations without recompute (all micro-batches in flight)
    double act_train_recompute = 0;  // the same with per-layer recompute
    double lora = 0;                 // LoRA A/B fp32
    double lora_grads = 0;           // fp32
    double adam = 0;                 // AdamW m and v, fp32
    double reserve = 0;              // runtime reserve
    double inference = 0;  // weights + KV + KDA + max(prefill, decode) activations + reserve
    double training = 0;   // weights + training activations (deck's recompute) + LoRA + reserve
    double peak = 0;       // the larger of the planned workloads
};

struct StagePlan {
    int stage = 0;
    int first_layer = 0, n_layer = 0;
    int n_kda = 0, n_mla = 0, n_dsa = 0, n_dense = 0, n_moe = 0;  // n_moe includes latent MoE
    std::array<int64_t, kPlanBlocks> params{};                    // per rank
    int64_t lora_params = 0;                                      // per rank
    StageMemory mem;
    StepPlan prefill, decode, train;  // one micro-batch through this stage
    int64_t f32_params = 0;  // of the weights, those held in fp32 whatever model.dtype (norms,
                             // conv taps, A_log, dt_bias, the router: model/weights.h; the vision
                             // tower's vectors are counted at model.dtype)
    int64_t weight_params() const;
};

// The deck's batch as planned (per dp replica).
struct PlanWorkload {
    DType dtype = DType::bf16;     // model.dtype: weights, activations
    DType kv_dtype = DType::bf16;  // inference.kv_cache.dtype: KV pages
    bool inference = false, training = false;
    bool training_primary = false;  // rank layouts by training (lora kind, or finetune only)
    int64_t prompt = 0;             // P
    int64_t new_tokens = 0;         // G
    int64_t context = 0;            // C = min(P + G, max_position)
    int64_t seqs = 0;               // B
    int64_t chunk = 0;              // T
    bool prompt_logprobs = false;   // logits for every prompt token
    int64_t page_tokens = 0;
    int64_t pages = 0;
    bool pages_auto = true;
    std::string offload = "none";
    int64_t micro_batch = 0, seq_len = 0, grad_accum = 0;
    bool recompute = false;
    int lora_rank = 0;
};

struct Plan {
    parallel::Layout layout;
    PlanWorkload work;
    deck::HardwareSection hw;
    std::vector<StagePlan> stages;                    // [pp]
    std::array<int64_t, kPlanBlocks> model_params{};  // whole model, each weight once
    int64_t total_params = 0, active_params = 0;      // Σ model_params; per text token
    double flops_per_token_prefill = 0;               // whole model forward, at context P/2
    double flops_per_token_decode = 0;                // at context P + G/2
    double flops_per_token_train = 0;                 // at context seq_len/2
    double experts_reached = 0;                       // u: ep ranks a token's experts are on
    StepPlan prefill, decode, train;                  // the pipeline's steps
    double batch_seconds = 0;      // inference: ⌈B·P/T⌉ prefill chunks + G decode steps
    double seconds_per_token = 0;  // the ranking key
    PlanPhase dominant = PlanPhase::compute;  // of the primary workload
    double peak_bytes = 0;                    // the fullest rank
    double capacity_bytes = 0;                // hardware.gpu_memory_gb
    bool fits = false;
    int64_t spare_pages = 0;  // KV pages the headroom of the fullest stage would still hold
};

// The plan for one layout. The layout must pass parallel::check_layout's fold rule and
// model_layout_problem (runtime/job.h); deck supplies model.dtype, inference, finetune, hardware.
Plan make_plan(const model::ModelConfig& model,
               const parallel::Layout& layout,
               const deck::Deck& deck);

// One layout of the search.
struct LayoutCandidate {
    parallel::Layout layout;
    bool fits = false;
    std::string rule;    // why rejected, the same words for every layout it rejects
    std::string reason;  // with the numbers: "memory 162.3 GB > 141 GB", "parallel.tp: 3 does ..."
    double peak_bytes = 0, seconds_per_token = 0;
    double prefill_seconds = 0, decode_seconds = 0, train_seconds = 0;
    PlanPhase dominant = PlanPhase::compute;
};

struct LayoutSearch {
    int gpus = 0;
    std::vector<LayoutCandidate> fitting;              // best first
    std::vector<LayoutCandidate> rejected;             // in enumeration order
    std::vector<std::pair<std::string, int>> reasons;  // rule → count, most frequent first
    std::optional<Plan> best;                          // the full plan of fitting[0]
};

// Every (tp, pp, dp, ep, etp) with tp·pp·dp = gpus, tp and etp dividing and at most
// hardware.gpus_per_node, ep dividing tp·dp and etp dividing tp·dp/ep; each rejected with its
// binding constraint (the grid's fold rule, the model rules, then memory) or planned and ranked
// by seconds_per_token (ties: less memory, then the smaller tp, pp, ep, etp).
LayoutSearch search_layouts(const model::ModelConfig& model, const deck::Deck& deck, int gpus);

// The plan of a job at its deck's layout, and the search when plan.gpus > 0.
struct JobPlan {
    Plan plan;
    std::optional<LayoutSearch> search;
};
JobPlan plan_job(const Job& job);

// The log text: the per-rank tables (memory by item and block, communication, time per phase),
// the time model, then the search's top `top` layouts, its rejections by rule, and the best
// layout's tables.
std::string plan_report(const Plan& plan, const std::string& title);
std::string search_report(const LayoutSearch& search, size_t top = 10);
std::string job_plan_report(const JobPlan& jp);

// /plan/... (the deck layout) and /search/... (with /search/best/... the best layout's plan).
// Collective over the writer's communicator; every rank passes the same plan.
void write_job_plan(io::H5Writer& file, const JobPlan& jp);

}  // namespace hymoe::runtime
