// The plan's step cost and time model (runtime/plan.h): the FLOPs per token, how far a token's
// experts spread over ep, collective bandwidths inside a node (NVLink) and across nodes
// (InfiniBand), and one micro-batch through one stage on one rank: its FLOPs, HBM traffic, tp/ep/pp
// communication bytes and the seconds of each phase.
#include <algorithm>
#include <cmath>

#include "plan_detail.h"

namespace hymoe::runtime::detail {

// ---- FLOPs and expert spread --------------------------------------------------------------------

double experts_reached(const ModelConfig& m, const parallel::Layout& l) {
    const i64 E = m.moe.n_routed_experts, k = m.moe.top_k;
    if (E <= 0 || k <= 0)
        return 0;
    const i64 away = E - E / l.ep;  // experts not on a given ep rank
    double none = 1;                // P(none of the k on that rank)
    for (i64 i = 0; i < k; ++i)
        none *= away - i <= 0 ? 0.0 : static_cast<double>(away - i) / static_cast<double>(E - i);
    return l.ep * (1 - none);
}

double flops_per_token(const ModelConfig& m, const Plan& plan, double c) {
    double f = 2.0 * static_cast<double>(plan.active_params);
    if (!m.tie_word_embeddings)
        f -= 2.0 * static_cast<double>(m.vocab_size) * m.hidden_size;
    const model::MlaConfig& a = m.mla;
    for (const LayerSpec& s : m.layers) {
        if (s.mixer == Mixer::kda) {
            f += 8.0 * m.kda.n_head * m.kda.head_dim * m.kda.head_dim;
            continue;
        }
        double keys = s.mixer == Mixer::dsa ? std::min<double>(m.indexer.top_k, c) : c;
        f += 2.0 * a.n_head * keys * (a.qk_nope_head_dim + a.qk_rope_head_dim + a.v_head_dim);
        if (s.mixer == Mixer::dsa)
            f += 2.0 * m.indexer.n_head * m.indexer.head_dim * c;
    }
    return f;
}

// ---- bandwidth ----------------------------------------------------------------------------------

namespace {

double nvlink(const deck::HardwareSection& hw) {
    return hw.nvlink_gb_s * 1e9;
}
// One GPU's share of its node's InfiniBand links.
double ib_per_gpu(const deck::HardwareSection& hw) {
    return hw.ib_gbit_s * 1e9 / 8 * hw.ib_links / hw.gpus_per_node;
}

}  // namespace

double group_bandwidth(const deck::HardwareSection& hw, i64 stride, i64 size) {
    return stride * size <= hw.gpus_per_node ? nvlink(hw) : ib_per_gpu(hw);
}

double ring(i64 n, double bytes) {
    return n <= 1 ? 0.0 : 2.0 * static_cast<double>(n - 1) / static_cast<double>(n) * bytes;
}

// ---- per-stage step -----------------------------------------------------------------------------

void finish_step(StepPlan& sc) {
    sc.total = std::max(sc.seconds[idx(PlanPhase::compute)], sc.seconds[idx(PlanPhase::hbm)]);
    for (PlanPhase p : {PlanPhase::tp, PlanPhase::ep, PlanPhase::pp, PlanPhase::dp})
        sc.total += sc.seconds[idx(p)];
    size_t best = 0;
    for (size_t i = 1; i < sc.seconds.size(); ++i)
        if (sc.seconds[i] > sc.seconds[best])
            best = i;
    sc.dominant = static_cast<PlanPhase>(best);
}

StepPlan stage_step(const Ctx& x,
                    const StagePlan& sp,
                    const std::vector<LayerParams>& layers,
                    const StepShape& sh) {
    const ModelConfig& m = x.m;
    const parallel::Layout& l = x.l;
    const double tp = x.tp(), d = x.d(), b = x.b, n = sh.n, c = sh.c;
    const bool train = sh.kind == StepKind::train, absorbed = sh.kind == StepKind::decode;
    const double nl = n / tp;  // this rank's token share in the MoE
    double flops = 0, weight_bytes = 0, cache_bytes = 0, tp_bytes = 0, tp_index = 0, ep_bytes = 0;
    for (int i = sp.first_layer; i < sp.first_layer + sp.n_layer; ++i) {
        const LayerSpec& s = m.layers[i];
        const LayerParams& lp = layers[static_cast<size_t>(i - sp.first_layer)];
        auto params = [&](PlanBlock block) { return lp.params[idx(block)]; };
        weight_bytes += params(PlanBlock::norms) * b;
        tp_bytes += 2 * n * d * b;  // mixer and FFN outputs
        if (s.mixer == Mixer::kda) {
            flops += 2 * n * params(PlanBlock::kda) +
                     8 * n * (m.kda.n_head / tp) * m.kda.head_dim * m.kda.head_dim;
            weight_bytes += params(PlanBlock::kda) * b;
            if (!train)
                cache_bytes += 2 * sh.seqs * kda_state_bytes(x);
        } else {
            const model::MlaConfig& a = m.mla;
            const double H = a.n_head / tp, keys = attended(x, s, c);
            flops += 2 * n * params(PlanBlock::mla);
            weight_bytes += params(PlanBlock::mla) * b;
            if (absorbed) {
                flops += 2 * n * H * keys * (2.0 * a.kv_lora_rank + a.qk_rope_head_dim);
            } else {
                flops +=
                    2 * n * H * keys * (a.qk_nope_head_dim + a.qk_rope_head_dim + a.v_head_dim);
                if (!train)  // the cached context's k_n, v re-expanded from the latent
                    flops += 2 * c * H * (a.qk_nope_head_dim + a.v_head_dim) * a.kv_lora_rank;
            }
            if (s.mixer == Mixer::dsa) {
                flops += 2 * n * params(PlanBlock::indexer) +
                         2 * n * (m.indexer.n_head / tp) * m.indexer.head_dim * c;
                weight_bytes += params(PlanBlock::indexer) * b;
                tp_index += n * c * kF32;  // partial index scores over the local indexer heads
            }
            if (!train) {  // read the context's cache (per sequence in decode, once a chunk in
                           // prefill), write the new tokens
                const double lat = (a.kv_lora_rank + a.qk_rope_head_dim) * b;
                const double read =
                    s.mixer == Mixer::dsa ? c * m.indexer.head_dim * b + keys * lat : c * lat;
                cache_bytes += (absorbed ? sh.seqs : 1.0) * read + n * kv_per_token(x, s);
            }
        }
        if (s.ffn == Ffn::dense) {
            const auto p = static_cast<double>(params(PlanBlock::dense_ffn));
            flops += 2 * n * p;
            weight_bytes += p * b;
            continue;
        }
        const model::MoeConfig& e = m.moe;
        const double w = static_cast<double>(expert_width(m, s));
        const auto one = static_cast<double>(lp.expert * l.etp);  // a whole expert
        const auto shared = static_cast<double>(params(PlanBlock::shared_experts));
        const auto router = static_cast<double>(lp.router_gate);
        const auto latent = static_cast<double>(params(PlanBlock::latent_proj));
        flops += 2 * nl * (router + latent) + 2 * nl * e.top_k * one + 2 * n * shared;
        // the experts this rank reads: of its E/ep, those some token of the expert group's
        // etp·ep ranks (nl tokens each) picks
        const double local = static_cast<double>(e.n_routed_experts / l.ep);
        const double untouched =
            std::pow(1.0 - static_cast<double>(e.top_k) / e.n_routed_experts, nl * l.ep * l.etp);
        weight_bytes += (router + latent + shared + local * (1 - untouched) * one / l.etp) * b;
        // each rank sends its etp block's tokens (etp·nl) to the u ep ranks of its etp slice;
        // 1/ep of those rows stay on the rank
        ep_bytes += 2 * nl * l.etp * x.u * (1 - 1.0 / l.ep) * w * b;
    }
    const bool first = sp.stage == 0, last = sp.stage == l.pp - 1;
    if (first)
        tp_bytes += n * d * b;  // the vocab-parallel embedding's partial rows
    if (last) {
        const double head = static_cast<double>(m.vocab_size) / tp * d;
        flops += 2 * sh.logits * head;
        weight_bytes += head * b;
    }
    double pp_bytes = (last ? 0.0 : n * d * b);
    if (train) {  // backward (input gradients only; the base is frozen) and the recompute
        const double passes = 2.0 + (x.w.recompute ? 1.0 : 0.0);
        flops *= passes;
        weight_bytes *= passes;
        tp_bytes *= passes;
        ep_bytes *= passes;
        tp_index *= passes - 1;  // the indexer runs in the forward passes only
        pp_bytes += first ? 0.0 : n * d * b;
    }
    StepPlan sc;
    sc.tokens = static_cast<i64>(n);
    sc.context = static_cast<i64>(c);
    sc.flops = flops;
    sc.hbm_bytes = weight_bytes + cache_bytes;
    sc.comm_bytes[idx(PlanPhase::tp)] = ring(l.tp, tp_bytes + tp_index);
    sc.comm_bytes[idx(PlanPhase::ep)] = l.ep * l.etp > 1 ? ep_bytes : 0.0;
    sc.comm_bytes[idx(PlanPhase::pp)] = l.pp > 1 ? pp_bytes : 0.0;
    const deck::HardwareSection& hw = x.hw;
    sc.seconds[idx(PlanPhase::compute)] = flops / (hw.tflops * 1e12);
    sc.seconds[idx(PlanPhase::hbm)] = sc.hbm_bytes / (hw.hbm_tb_s * 1e12);
    sc.seconds[idx(PlanPhase::tp)] =
        sc.comm_bytes[idx(PlanPhase::tp)] / group_bandwidth(hw, 1, l.tp);
    // all-to-all over the etp·ep consecutive ranks of the expert group: the peers outside this
    // node take their share of the bytes over InfiniBand
    const double peers = static_cast<double>(l.ep) * l.etp;
    const double in_node = std::min<double>(peers, hw.gpus_per_node);
    const double off = peers > 1 ? (peers - in_node) / (peers - 1) : 0.0;
    sc.seconds[idx(PlanPhase::ep)] =
        sc.comm_bytes[idx(PlanPhase::ep)] * ((1 - off) / nvlink(hw) + off / ib_per_gpu(hw));
    sc.seconds[idx(PlanPhase::pp)] =
        sc.comm_bytes[idx(PlanPhase::pp)] / group_bandwidth(hw, l.tp * l.dp, 2);
    finish_step(sc);
    return sc;
}

}  // namespace hymoe::runtime::detail
