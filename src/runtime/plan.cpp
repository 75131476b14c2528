// The plan for one layout (runtime/plan.h, which states every rule used here): the workload a
// deck asks for, the layers of each pipeline stage, and make_plan, which puts together each
// stage's weights (plan_weights.cpp), memory (plan_memory.cpp) and step costs (plan_comm.cpp) into
// the job's step times, time per token, peak memory and spare KV pages.
#include "hymoe/runtime/plan.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "hymoe/model/shard.h"
#include "plan_detail.h"

namespace hymoe::runtime {

using namespace detail;

const char* to_string(PlanBlock b) {
    switch (b) {
        case PlanBlock::embedding:
            return "embedding";
        case PlanBlock::head:
            return "lm head";
        case PlanBlock::kda:
            return "KDA";
        case PlanBlock::mla:
            return "MLA/DSA attention";
        case PlanBlock::indexer:
            return "DSA indexer";
        case PlanBlock::dense_ffn:
            return "dense FFN";
        case PlanBlock::router:
            return "MoE router";
        case PlanBlock::routed_experts:
            return "routed experts";
        case PlanBlock::shared_experts:
            return "shared experts";
        case PlanBlock::latent_proj:
            return "latent projections";
        case PlanBlock::norms:
            return "norms";
        case PlanBlock::vision:
            return "vision";
    }
    return "?";
}

const char* to_string(PlanPhase p) {
    switch (p) {
        case PlanPhase::compute:
            return "compute";
        case PlanPhase::hbm:
            return "hbm";
        case PlanPhase::tp:
            return "tp all-reduce";
        case PlanPhase::ep:
            return "ep dispatch+combine";
        case PlanPhase::pp:
            return "pp send";
        case PlanPhase::dp:
            return "dp all-reduce";
    }
    return "?";
}

int64_t StagePlan::weight_params() const {
    int64_t n = 0;
    for (int64_t p : params)
        n += p;
    return n;
}

namespace {

// ---- workload -----------------------------------------------------------------------------------

PlanWorkload workload(const ModelConfig& m, const deck::Deck& deck) {
    PlanWorkload w;
    const deck::JobKind kind = deck.job.kind;
    const deck::InferenceSection& in = deck.inference;
    const deck::FinetuneSection& ft = deck.finetune;
    w.dtype = deck.model.dtype;
    w.kv_dtype = deck.inference.kv_dtype;
    w.training = ft.present;
    w.inference =
        in.present || kind == deck::JobKind::infer || (kind == deck::JobKind::plan && !ft.present);
    w.training_primary = w.training && (kind == deck::JobKind::lora || !w.inference);
    w.prompt = in.max_tokens;
    w.new_tokens = in.max_new_tokens;
    w.context = std::min<i64>(w.prompt + w.new_tokens, m.max_position);
    w.seqs = in.max_seqs;
    w.chunk = in.prefill_chunk;
    w.prompt_logprobs = in.prompt_logprobs;
    w.page_tokens = in.page_tokens;
    w.pages_auto = in.pages == 0;
    w.pages = w.pages_auto ? w.seqs * ((w.context + w.page_tokens - 1) / w.page_tokens) : in.pages;
    w.offload = in.offload;
    w.micro_batch = ft.micro_batch;
    w.seq_len = ft.seq_len;
    w.grad_accum = ft.grad_accum;
    w.recompute = ft.recompute;
    w.lora_rank = ft.lora.rank;
    return w;
}

// A stage step repeated `times` on one rank (micro-batches), taking `slots` stage-times.
StepPlan repeat(StepPlan sc, double times, double slots) {
    sc.tokens = static_cast<i64>(static_cast<double>(sc.tokens) * times);
    sc.flops *= times;
    sc.hbm_bytes *= times;
    for (double& v : sc.comm_bytes)
        v *= times;
    for (double& v : sc.seconds)
        v *= slots;
    finish_step(sc);
    return sc;
}

// The slowest stage's step.
StepPlan slowest(const std::vector<StagePlan>& stages, StepPlan StagePlan::*step) {
    const StepPlan* worst = &(stages[0].*step);
    for (const StagePlan& sp : stages)
        if ((sp.*step).total > worst->total)
            worst = &(sp.*step);
    return *worst;
}

}  // namespace

// ---- the plan -----------------------------------------------------------------------------------

Plan make_plan(const ModelConfig& m, const parallel::Layout& l, const deck::Deck& deck) {
    Plan plan;
    plan.layout = l;
    plan.work = workload(m, deck);
    plan.hw = deck.hardware;
    const PlanWorkload& w = plan.work;
    Ctx x{m, l, w, deck.hardware, static_cast<double>(dtype_size(w.dtype)), experts_reached(m, l)};
    plan.experts_reached = x.u;
    model_weights(m, plan);
    const double P = static_cast<double>(std::min(w.prompt, w.context));
    plan.flops_per_token_prefill = flops_per_token(m, plan, P / 2);
    plan.flops_per_token_decode =
        flops_per_token(m, plan, std::min<double>(P + w.new_tokens / 2.0, w.context));
    plan.flops_per_token_train = flops_per_token(m, plan, w.seq_len / 2.0);

    const std::vector<int> starts = stage_starts(m, l.pp);
    const i64 decode_mb = std::min<i64>(l.pp, w.seqs);  // micro-batches of the decode step
    const double decode_n = std::ceil(static_cast<double>(w.seqs) / decode_mb);
    const double n_p = static_cast<double>(std::min(w.chunk, w.prompt));
    LayerKinds kinds;
    for (int s = 0; s < l.pp; ++s) {
        StagePlan sp;
        sp.stage = s;
        sp.first_layer = starts[s];
        sp.n_layer = starts[s + 1] - starts[s];
        const std::vector<LayerParams> layers = stage_weights(m, l, sp, kinds);
        LoraCount lc;
        if (w.training)
            lc = lora_params(m, l, deck.finetune.lora, sp.first_layer, sp.n_layer);
        sp.lora_params = lc.dense + lc.expert;
        stage_memory(x, sp);
        sp.prefill = stage_step(
            x, sp, layers, {StepKind::prefill, n_p, 1, P / 2, w.prompt_logprobs ? n_p : 1});
        sp.decode = stage_step(x,
                               sp,
                               layers,
                               {StepKind::decode,
                                decode_n,
                                decode_n,
                                std::min<double>(P + w.new_tokens / 2.0, w.context),
                                decode_n});
        if (w.training) {
            const double n_t = static_cast<double>(w.micro_batch * w.seq_len);
            sp.train = stage_step(
                x,
                sp,
                layers,
                {StepKind::train, n_t, static_cast<double>(w.micro_batch), w.seq_len / 2.0, n_t});
            // the LoRA gradients' all-reduce once a step: dense adapters over dp, expert adapters
            // over edp (one per expert) or ep·edp (one per layer)
            const i64 g = deck.finetune.lora.per_expert ? l.edp() : l.ep * l.edp();
            const double stride = deck.finetune.lora.per_expert ? l.etp * l.ep : l.etp;
            const double dense = ring(l.dp, static_cast<double>(lc.dense) * kF32);
            const double expert = ring(g, static_cast<double>(lc.expert) * kF32);
            sp.train.comm_bytes[idx(PlanPhase::dp)] = dense + expert;
            sp.train.seconds[idx(PlanPhase::dp)] =
                dense / group_bandwidth(deck.hardware, l.tp, l.dp) +
                expert / group_bandwidth(deck.hardware, static_cast<i64>(stride), g);
        }
        plan.stages.push_back(std::move(sp));
    }

    plan.prefill = slowest(plan.stages, &StagePlan::prefill);
    plan.decode = repeat(slowest(plan.stages, &StagePlan::decode),
                         static_cast<double>(decode_mb),
                         static_cast<double>(l.pp));
    if (w.training) {
        StepPlan t = slowest(plan.stages, &StagePlan::train);
        const double dp_seconds = t.seconds[idx(PlanPhase::dp)],
                     dp_bytes = t.comm_bytes[idx(PlanPhase::dp)];
        t.seconds[idx(PlanPhase::dp)] = 0;
        t.comm_bytes[idx(PlanPhase::dp)] = 0;
        t = repeat(
            t, static_cast<double>(w.grad_accum), static_cast<double>(w.grad_accum + l.pp - 1));
        t.seconds[idx(PlanPhase::dp)] = dp_seconds;
        t.comm_bytes[idx(PlanPhase::dp)] = dp_bytes;
        finish_step(t);
        plan.train = t;
    }

    if (!w.inference) {  // not planned: zeros in the tables and plan.h5
        plan.prefill = plan.decode = StepPlan{};
        for (StagePlan& sp : plan.stages)
            sp.prefill = sp.decode = StepPlan{};
    }

    // inference batch: the prefill of B prompts in chunks, then G decode steps
    const double chunks = std::ceil(static_cast<double>(w.seqs) * P / std::max(1.0, n_p));
    plan.batch_seconds =
        chunks * plan.prefill.total + static_cast<double>(w.new_tokens) * plan.decode.total;
    if (w.training_primary) {
        plan.seconds_per_token = plan.train.total / (static_cast<double>(l.dp) * w.grad_accum *
                                                     w.micro_batch * w.seq_len);
        plan.dominant = plan.train.dominant;
    } else {
        const double tokens = static_cast<double>(l.dp) * w.seqs * (P + w.new_tokens);
        plan.seconds_per_token = plan.batch_seconds / tokens;
        PhaseArray sum{};
        for (size_t i = 0; i < sum.size(); ++i)
            sum[i] = chunks * plan.prefill.seconds[i] + w.new_tokens * plan.decode.seconds[i];
        plan.dominant =
            static_cast<PlanPhase>(std::max_element(sum.begin(), sum.end()) - sum.begin());
    }

    plan.capacity_bytes = deck.hardware.gpu_memory_gb * 1e9;
    plan.spare_pages = std::numeric_limits<i64>::max();
    bool any_attention = false;
    for (const StagePlan& sp : plan.stages) {
        plan.peak_bytes = std::max(plan.peak_bytes, sp.mem.peak);
        double per_page = 0;
        for (int i = sp.first_layer; i < sp.first_layer + sp.n_layer; ++i)
            per_page += kv_per_token(x, m.layers[i]) * static_cast<double>(w.page_tokens);
        if (per_page > 0 && w.inference) {
            any_attention = true;
            const double spare = std::max(0.0, plan.capacity_bytes - sp.mem.peak) / per_page;
            plan.spare_pages = std::min(plan.spare_pages, static_cast<i64>(spare));
        }
    }
    if (!any_attention)
        plan.spare_pages = 0;
    plan.fits = plan.peak_bytes <= plan.capacity_bytes;
    return plan;
}

}  // namespace hymoe::runtime
