// The GPU model's fused-kernel choices and their device bytes (hymoe/model/fused_step.h).
#include "hymoe/model/fused_step.h"

#include <algorithm>
#include <limits>

#include "hymoe/model/moe_parallel.h"

namespace hymoe::model {

namespace cu = backend::cuda;

DsaFusedPlan dsa_fused_plan(
    const ModelConfig& cfg, int64_t n_rows, int64_t max_visible, bool one_sequence, int n_sm) {
    DsaFusedPlan P;
    if (n_rows < 1 || n_rows > 65535 || max_visible < 1 ||
        max_visible > std::numeric_limits<int32_t>::max()) {
        P.why = "1 to 65535 rows (one sparse-attention block row each), int32 key counts";
        return P;
    }
    if (cfg.indexer.top_k < 1 || cfg.mla.q_lora_rank <= 0) {
        P.why = "DSA needs top_k ≥ 1 and a query latent";
        return P;
    }
    P.top_k = static_cast<int>(std::min<int64_t>(cfg.indexer.top_k, max_visible));
    P.indexer = cu::indexer_topk_plan(static_cast<int>(n_rows),
                                      static_cast<int>(max_visible),
                                      cfg.indexer.n_head,
                                      cfg.indexer.head_dim,
                                      P.top_k,
                                      one_sequence,
                                      n_sm);
    P.attention =
        cu::mla_sparse_plan(cfg.mla.n_head, cfg.mla.kv_lora_rank, cfg.mla.qk_rope_head_dim);
    if (!P.indexer.supported) {
        P.why = P.indexer.why;
        return P;
    }
    if (!P.attention.supported) {
        P.why = P.attention.why;
        return P;
    }
    P.supported = true;
    return P;
}

int64_t dsa_fused_bytes(const ModelConfig& cfg, int64_t max_tokens, int n_sm) {
    if (count_layers(cfg, Mixer::dsa) == 0)
        return 0;
    const int64_t top_k = cfg.indexer.top_k;
    // An indexer plan splits keys only while its query blocks are fewer than 2·n_sm; then
    // n_q·n_split ≤ qb·blocks·⌈2·n_sm / blocks⌉ < qb·(2·n_sm + blocks) < 4·qb·n_sm (qb ≤ 2), and
    // never more than 64 splits a query.
    const int64_t split_rows = std::min<int64_t>(64 * max_tokens, 8 * int64_t{n_sm});
    return max_tokens * top_k * 4 + split_rows * top_k * 8;
}

int64_t moe_fused_bytes(const ModelConfig& cfg, int64_t max_tokens) {
    const MoeConfig& m = cfg.moe;
    int64_t most = 0;
    for (const LayerSpec& spec : cfg.layers) {
        // the MoE layers the fused kernels take at max_tokens rows (bf16 experts, groups of one)
        if ((spec.ffn != Ffn::moe && spec.ffn != Ffn::latent_moe) ||
            !moe_runs_fused(Device::cuda, cfg, spec, DType::bf16, max_tokens, MoeParallel{}, false))
            continue;
        const int64_t width = spec.ffn == Ffn::latent_moe ? m.latent_size : cfg.hidden_size;
        const cu::MoePlan plan = cu::moe_plan(
            max_tokens, m.top_k, m.n_routed_experts, static_cast<int>(width), m.moe_intermediate);
        const int64_t assignments = max_tokens * m.top_k;
        most = std::max(most,
                        plan.scratch_bytes + assignments * (m.moe_intermediate + width) * 2 +
                            assignments * (4 + 4));
    }
    return most;
}

}  // namespace hymoe::model
