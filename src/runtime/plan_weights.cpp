// The plan's weights: each block's parameters (spec/model-math.md §3-8 and the block headers
// model/kda.h, attention.h, ffn.h), split over tp or replicated as runtime/plan.h states, for the
// whole model and for one rank of each stage, and the LoRA adapters a rank trains. At one rank the
// per-block sums equal model::count_params exactly (tests/unit/runtime/test_plan.cpp).
#include <algorithm>

#include "plan_detail.h"

namespace hymoe::runtime::detail {

// ---- block shapes -------------------------------------------------------------------------------

Part kda_part(i64 d, const model::KdaConfig& k) {
    const i64 H = k.n_head, K = k.head_dim, D = H * K, W = k.conv_kernel;
    return {3 * D * d + 3 * D * W + D * K + D + H + H * d + D * K + d * D, 2 * K * d + K};
}

Part mla_part(i64 d, const model::MlaConfig& a, bool gated) {
    const i64 H = a.n_head, rq = a.q_lora_rank, rkv = a.kv_lora_rank,
              dq = a.qk_nope_head_dim + a.qk_rope_head_dim;
    Part p;
    p.split = (rq > 0 ? H * dq * rq : H * dq * d) + H * (a.qk_nope_head_dim + a.v_head_dim) * rkv +
              d * H * a.v_head_dim + (gated ? H * a.v_head_dim * d : 0);
    p.repl = (rq > 0 ? rq * d + rq : 0) + (rkv + a.qk_rope_head_dim) * d + rkv;
    return p;
}

Part indexer_part(i64 d, const model::IndexerConfig& x, i64 rq) {
    return {x.n_head * x.head_dim * rq + x.n_head * d, x.head_dim * d + 2 * x.head_dim};
}

// The vectors of one layer's mixer and router, held in fp32 whatever model.dtype (model/weights.h
// stored_matrix): KDA conv taps, dt_bias, A_log (split), o_norm (whole); MLA's two latent norms;
// the indexer's key LayerNorm; the router gate and its bias.
Part f32_part(const ModelConfig& m, const LayerSpec& s) {
    Part p;
    if (s.mixer == Mixer::kda) {
        const i64 D = static_cast<i64>(m.kda.n_head) * m.kda.head_dim;
        p.split = 3 * D * m.kda.conv_kernel + D + m.kda.n_head;
        p.repl = m.kda.head_dim;
    } else {
        p.repl = (m.mla.q_lora_rank > 0 ? m.mla.q_lora_rank : 0) + m.mla.kv_lora_rank +
                 (s.mixer == Mixer::dsa ? 2 * m.indexer.head_dim : 0);
    }
    if (s.ffn != Ffn::dense)
        p.repl += m.moe.n_routed_experts * (m.hidden_size + (m.moe.correction_bias ? 1 : 0));
    return p;
}

i64 expert_params(i64 width, i64 inter, ExpertAct act) {
    return (act == ExpertAct::swiglu ? 3 : 2) * width * inter;
}

// ---- LoRA ---------------------------------------------------------------------------------------

LoraCount lora_params(const ModelConfig& m,
                      const parallel::Layout& l,
                      const deck::LoraSection& lora,
                      int first,
                      int n_layer) {
    auto has = [&](const char* t) {
        return std::find(lora.target_modules.begin(), lora.target_modules.end(), t) !=
               lora.target_modules.end();
    };
    const i64 r = lora.rank, d = m.hidden_size, tp = l.tp, etp = l.etp;
    auto col = [&](i64 in, i64 out, i64 split) { return r * in + out * r / split; };
    auto row = [&](i64 in, i64 out, i64 split) { return r * in / split + out * r; };
    auto mlp = [&](i64 width, i64 inter, i64 split, ExpertAct act, bool all) {
        i64 n = 0;
        if (act == ExpertAct::swiglu && (all || has("gate_proj")))
            n += col(width, inter, split);
        if (all || has("up_proj"))
            n += col(width, inter, split);
        if (all || has("down_proj"))
            n += row(inter, width, split);
        return n;
    };
    LoraCount c;
    for (int i = first; i < first + n_layer; ++i) {
        const LayerSpec& s = m.layers[i];
        if (s.mixer == Mixer::kda) {
            const i64 D = static_cast<i64>(m.kda.n_head) * m.kda.head_dim;
            for (const char* t : {"q_proj", "k_proj", "v_proj"})
                c.dense += has(t) ? col(d, D, tp) : 0;
            c.dense += has("o_proj") ? row(D, d, tp) : 0;
        } else {
            const model::MlaConfig& a = m.mla;
            const i64 H = a.n_head, dq = a.qk_nope_head_dim + a.qk_rope_head_dim;
            c.dense += has("q_proj") ? col(a.q_lora_rank > 0 ? a.q_lora_rank : d, H * dq, tp) : 0;
            c.dense += has("k_proj") ? col(d, a.kv_lora_rank + a.qk_rope_head_dim, 1) : 0;
            c.dense += has("v_proj")
                           ? col(a.kv_lora_rank, H * (a.qk_nope_head_dim + a.v_head_dim), tp)
                           : 0;
            c.dense += has("o_proj") ? row(H * a.v_head_dim, d, tp) : 0;
        }
        if (s.ffn == Ffn::dense) {
            c.dense += mlp(d, m.intermediate_size, tp, ExpertAct::swiglu, false);
            continue;
        }
        if (m.moe.shared_intermediate > 0)
            c.dense +=
                mlp(d, m.moe.shared_intermediate, tp, m.moe.expert_act, has("shared_experts"));
        if (has("experts")) {
            i64 one = mlp(expert_width(m, s), m.moe.moe_intermediate, etp, m.moe.expert_act, true);
            c.expert += lora.per_expert ? one * (m.moe.n_routed_experts / l.ep) : one;
        }
    }
    return c;
}

// ---- per-stage and whole-model weights ----------------------------------------------------------

void stage_weights(const ModelConfig& m, const parallel::Layout& l, StagePlan& sp, int pp) {
    const i64 d = m.hidden_size, tp = l.tp;
    auto& p = sp.params;
    for (int i = sp.first_layer; i < sp.first_layer + sp.n_layer; ++i) {
        const LayerSpec& s = m.layers[i];
        p[idx(PlanBlock::norms)] += 2 * d;
        sp.f32_params += 2 * d + f32_part(m, s).per_rank(l.tp);
        switch (s.mixer) {
            case Mixer::kda:
                p[idx(PlanBlock::kda)] += kda_part(d, m.kda).per_rank(l.tp);
                ++sp.n_kda;
                break;
            case Mixer::mla:
                p[idx(PlanBlock::mla)] += mla_part(d, m.mla, s.gated).per_rank(l.tp);
                ++sp.n_mla;
                break;
            case Mixer::dsa:
                p[idx(PlanBlock::mla)] += mla_part(d, m.mla, s.gated).per_rank(l.tp);
                p[idx(PlanBlock::indexer)] +=
                    indexer_part(d, m.indexer, m.mla.q_lora_rank).per_rank(l.tp);
                ++sp.n_dsa;
                break;
        }
        if (s.ffn == Ffn::dense) {
            p[idx(PlanBlock::dense_ffn)] += 3 * d * m.intermediate_size / tp;
            ++sp.n_dense;
            continue;
        }
        const model::MoeConfig& e = m.moe;
        ++sp.n_moe;
        p[idx(PlanBlock::router)] +=
            e.n_routed_experts * d + (e.correction_bias ? e.n_routed_experts : 0);
        if (s.ffn == Ffn::latent_moe)
            p[idx(PlanBlock::latent_proj)] += 2 * d * e.latent_size;
        p[idx(PlanBlock::shared_experts)] +=
            expert_params(d, e.shared_intermediate, e.expert_act) / tp;
        p[idx(PlanBlock::routed_experts)] +=
            (e.n_routed_experts / l.ep) *
            (expert_params(expert_width(m, s), e.moe_intermediate, e.expert_act) / l.etp);
    }
    if (sp.stage == 0) {
        p[idx(PlanBlock::embedding)] += m.vocab_size * d / tp;
        p[idx(PlanBlock::vision)] += model::count_params(m).vision;
    }
    if (sp.stage == pp - 1) {
        p[idx(PlanBlock::norms)] += d;
        sp.f32_params += d;
        if (!m.tie_word_embeddings || pp > 1)  // a tied head on its own stage keeps a copy
            p[idx(PlanBlock::head)] += m.vocab_size * d / tp;
    }
}

void model_weights(const ModelConfig& m, Plan& plan) {
    const i64 d = m.hidden_size;
    auto& p = plan.model_params;
    p[idx(PlanBlock::embedding)] = m.vocab_size * d;
    p[idx(PlanBlock::head)] = m.tie_word_embeddings ? 0 : m.vocab_size * d;
    p[idx(PlanBlock::norms)] = d;
    p[idx(PlanBlock::vision)] = model::count_params(m).vision;
    i64 active_experts = 0;
    for (const LayerSpec& s : m.layers) {
        p[idx(PlanBlock::norms)] += 2 * d;
        if (s.mixer == Mixer::kda)
            p[idx(PlanBlock::kda)] += kda_part(d, m.kda).total();
        else
            p[idx(PlanBlock::mla)] += mla_part(d, m.mla, s.gated).total();
        if (s.mixer == Mixer::dsa)
            p[idx(PlanBlock::indexer)] += indexer_part(d, m.indexer, m.mla.q_lora_rank).total();
        if (s.ffn == Ffn::dense) {
            p[idx(PlanBlock::dense_ffn)] += 3 * d * m.intermediate_size;
            continue;
        }
        const model::MoeConfig& e = m.moe;
        const i64 one = expert_params(expert_width(m, s), e.moe_intermediate, e.expert_act);
        p[idx(PlanBlock::router)] +=
            e.n_routed_experts * d + (e.correction_bias ? e.n_routed_experts : 0);
        if (s.ffn == Ffn::latent_moe)
            p[idx(PlanBlock::latent_proj)] += 2 * d * e.latent_size;
        p[idx(PlanBlock::shared_experts)] += expert_params(d, e.shared_intermediate, e.expert_act);
        p[idx(PlanBlock::routed_experts)] += e.n_routed_experts * one;
        active_experts += e.top_k * one;
    }
    plan.total_params = 0;
    for (i64 n : p)
        plan.total_params += n;
    plan.active_params = plan.total_params - p[idx(PlanBlock::vision)] -
                         p[idx(PlanBlock::routed_experts)] + active_experts;
}

}  // namespace hymoe::runtime::detail
