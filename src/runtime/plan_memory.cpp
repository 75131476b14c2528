// The plan's memory per rank: the KV cache (and what offload moves to the host), the KDA state,
// the activations of inference (prefill chunk, decode step) and of training (the 1F1B micro-
// batches in flight, with or without recompute), and the LoRA weights, gradients and Adam moments;
// each stage's peak over the workloads, with a fixed reserve.
#include <algorithm>
#include <cmath>

#include "hymoe/model/kv_cache.h"
#include "plan_detail.h"

namespace hymoe::runtime::detail {

namespace {

constexpr double kReserveBytes = 2e9;  // CUDA context, NCCL buffers, allocator slack
constexpr int kKdaChunk = 64;          // KDA chunk length: training keeps a state per chunk

}  // namespace

// ---- cache and state ----------------------------------------------------------------------------

double kv_per_token(const Ctx& x, const LayerSpec& s) {
    return static_cast<double>(model::kv_row_floats(x.m, s.mixer)) *
           static_cast<double>(dtype_size(x.w.kv_dtype));
}

double kda_state_bytes(const Ctx& x) {
    const model::KdaConfig& k = x.m.kda;
    const double H = k.n_head / x.tp(), K = k.head_dim;
    return (H * K * K + 3.0 * (k.conv_kernel - 1) * H * K) * kF32;
}

double attended(const Ctx& x, const LayerSpec& s, double c) {
    return s.mixer == Mixer::dsa ? std::min<double>(x.m.indexer.top_k, c) : c;
}

// ---- working sets and saved activations ---------------------------------------------------------

namespace {

// Working set of a mixer over n new tokens at context c (bytes). Attention is flash-style (the
// scores are tiled, never whole); absorbed: decode's MQA form over the latent, else the context's
// k_n and v re-expanded for the MHA form. DSA also holds the chunk's index scores over the whole
// context [n, c] fp32, the top-k indices [n, k] int32, and the context's indexer keys [c, d_I]
// gathered once a call (bf16 tiles from a bf16 cache, where the indexer runs in bf16; else fp32).
double mixer_work(const Ctx& x, const LayerSpec& s, double n, double c, bool absorbed) {
    const double tp = x.tp(), b = x.b;
    if (s.mixer == Mixer::kda) {
        const double D = x.m.kda.n_head * x.m.kda.head_dim / tp, H = x.m.kda.n_head / tp;
        return n * (8 * D * b + D * kF32 + H * kF32);  // q,k,v before/after conv, o, gate; g, β
    }
    const model::MlaConfig& a = x.m.mla;
    const double H = a.n_head / tp, dq = a.qk_nope_head_dim + a.qk_rope_head_dim;
    double bytes = n *
                   (a.q_lora_rank + H * dq + a.kv_lora_rank + a.qk_rope_head_dim +
                    H * a.v_head_dim * (s.gated ? 2 : 1)) *
                   b;
    if (absorbed)
        bytes += n * H * (2.0 * a.kv_lora_rank + a.qk_rope_head_dim) * b;  // q̂ and the latent o
    else
        bytes += c * H * (a.qk_nope_head_dim + a.v_head_dim) * b;  // k_n, v over the context
    if (s.mixer == Mixer::dsa) {
        const double HI = x.m.indexer.n_head / tp;
        const double key_bytes = x.w.kv_dtype == DType::bf16 ? 2.0 : kF32;
        bytes += n * (HI * x.m.indexer.head_dim * b + HI * kF32) + n * c * kF32 +
                 n * attended(x, s, c) * kF32 + c * x.m.indexer.head_dim * key_bytes;
    }
    return bytes;
}

// Tokens one rank routes, dispatches and projects: its 1/tp share (at least one row).
double token_share(const Ctx& x, double n) {
    return std::ceil(n / x.tp());
}

// Working set of an FFN over n tokens (bytes): dense gate/up/product; MoE router probabilities,
// dispatch and combine send/receive buffers (u·etp rows a token; at ep 1 only send and the
// partials: the pipeline moves them to the other side instead of copying), the top-k-expanded
// expert inputs, hiddens and outputs, the latent z and y_lat, and the shared experts' hiddens.
double ffn_work(const Ctx& x, const LayerSpec& s, double n) {
    const double b = x.b;
    if (s.ffn == Ffn::dense)
        return 3 * n * x.m.intermediate_size / x.tp() * b;
    const model::MoeConfig& e = x.m.moe;
    const double nl = token_share(x, n), w = static_cast<double>(expert_width(x.m, s)),
                 etp = x.l.etp, k = e.top_k;
    double bytes = nl * e.n_routed_experts * kF32;
    bytes += (x.l.ep > 1 ? 4 : 2) * nl * x.u * etp * w * b;
    bytes += 2 * nl * k * etp * w * b + nl * k * mlp_tensors(e.expert_act) * e.moe_intermediate * b;
    if (s.ffn == Ffn::latent_moe)
        bytes += 2 * nl * e.latent_size * b;
    bytes += n * mlp_tensors(e.expert_act) * e.shared_intermediate / x.tp() * b;
    return bytes;
}

// Bytes a training step keeps per token of one layer for its backward (flash attention: only the
// log-sum-exp; the DSA indexer is detached, only the top-k indices are kept).
double saved_per_token(const Ctx& x, const LayerSpec& s, double seq_len) {
    const double tp = x.tp(), b = x.b, d = x.d();
    double bytes = 4 * d * b;  // layer input, its norm, the mid-layer residual and its norm
    if (s.mixer == Mixer::kda) {
        const double H = x.m.kda.n_head / tp, K = x.m.kda.head_dim, D = H * K;
        bytes += (8 * D + 2 * K) * b + D * kF32 + H * kF32 + H * K * K * kF32 / kKdaChunk;
    } else {
        const model::MlaConfig& a = x.m.mla;
        const double H = a.n_head / tp;
        bytes += (2.0 * a.q_lora_rank + H * (a.qk_nope_head_dim + a.qk_rope_head_dim) +
                  2.0 * (a.kv_lora_rank + a.qk_rope_head_dim) +
                  H * (a.qk_nope_head_dim + a.v_head_dim) + H * a.v_head_dim * (s.gated ? 2 : 1)) *
                     b +
                 H * kF32;
        if (s.mixer == Mixer::dsa)
            bytes += std::min<double>(x.m.indexer.top_k, seq_len) * kF32;
    }
    if (s.ffn == Ffn::dense) {
        bytes += 3 * x.m.intermediate_size / tp * b;
    } else {
        const model::MoeConfig& e = x.m.moe;
        const double w = static_cast<double>(expert_width(x.m, s));
        double share =
            e.n_routed_experts * kF32 + e.top_k * x.l.etp * w * b +
            e.top_k * mlp_tensors(e.expert_act) * static_cast<double>(e.moe_intermediate) * b;
        if (s.ffn == Ffn::latent_moe)
            share += 2.0 * e.latent_size * b;
        bytes += share / tp + mlp_tensors(e.expert_act) * e.shared_intermediate / tp * b;
    }
    return bytes;
}

}  // namespace

// ---- per-stage memory ---------------------------------------------------------------------------

void stage_memory(const Ctx& x, StagePlan& sp) {
    const ModelConfig& m = x.m;
    const PlanWorkload& w = x.w;
    const double b = x.b, d = x.d(), tp = x.tp();
    StageMemory& mem = sp.mem;
    const auto f32 = static_cast<double>(sp.f32_params);  // held in fp32 at any model.dtype
    mem.weights = (static_cast<double>(sp.weight_params()) - f32) * b + f32 * 4;
    mem.reserve = kReserveBytes;
    const bool last = sp.stage == x.l.pp - 1;
    double kv_stage = 0, kv_layer_max = 0, mixer_p = 0, mixer_d = 0, mixer_t = 0, ffn_p = 0,
           ffn_d = 0, ffn_t = 0, saved = 0, saved_max = 0;
    const double n_p = static_cast<double>(std::min(w.chunk, w.prompt));
    const double n_t = static_cast<double>(w.micro_batch * w.seq_len);
    const double P = static_cast<double>(std::min(w.prompt, w.context));
    for (int i = sp.first_layer; i < sp.first_layer + sp.n_layer; ++i) {
        const LayerSpec& s = m.layers[i];
        kv_stage += kv_per_token(x, s);
        kv_layer_max = std::max(kv_layer_max, kv_per_token(x, s));
        mixer_p = std::max(mixer_p, mixer_work(x, s, n_p, P, false));
        mixer_d = std::max(mixer_d, mixer_work(x, s, w.seqs, w.context, true));
        ffn_p = std::max(ffn_p, ffn_work(x, s, n_p));
        ffn_d = std::max(ffn_d, ffn_work(x, s, w.seqs));
        if (w.training) {
            mixer_t = std::max(mixer_t, mixer_work(x, s, n_t, w.seq_len, false));
            ffn_t = std::max(ffn_t, ffn_work(x, s, n_t));
            const double one = saved_per_token(x, s, w.seq_len);
            saved += one;
            saved_max = std::max(saved_max, one);
        }
    }
    const double logit_row = static_cast<double>(m.vocab_size) / tp * kF32;
    if (w.inference) {
        const double tokens = static_cast<double>(w.pages * w.page_tokens);
        if (w.offload == "none") {
            mem.kv_cache = tokens * kv_stage;
        } else {  // the current layer's pages and the next one's, prefetched
            mem.kv_cache = tokens * kv_layer_max * std::min(2, sp.n_mla + sp.n_dsa);
            mem.kv_host = tokens * kv_stage - mem.kv_cache;
        }
        mem.kda_state = static_cast<double>(w.seqs) * sp.n_kda * kda_state_bytes(x);
        const double prefill_logits = w.prompt_logprobs ? n_p : 1.0;
        mem.act_prefill =
            3 * n_p * d * b + std::max(mixer_p, ffn_p) + (last ? prefill_logits * logit_row : 0.0);
        mem.act_decode = 3.0 * static_cast<double>(w.seqs) * d * b + std::max(mixer_d, ffn_d) +
                         (last ? static_cast<double>(w.seqs) * logit_row : 0.0);
        mem.inference = mem.weights + mem.kv_cache + mem.kda_state +
                        std::max(mem.act_prefill, mem.act_decode) + mem.reserve;
    }
    if (w.training) {
        // 1F1B: stage s holds the activations of min(pp − s, grad_accum) micro-batches
        const double inflight =
            static_cast<double>(std::max<i64>(1, std::min<i64>(x.l.pp - sp.stage, w.grad_accum)));
        const double work = std::max(mixer_t, ffn_t) + (last ? 2 * n_t * logit_row : 0.0);
        mem.act_train = inflight * n_t * saved + work;
        mem.act_train_recompute = inflight * n_t * sp.n_layer * d * b + n_t * saved_max + work;
        mem.lora = static_cast<double>(sp.lora_params) * kF32;
        mem.lora_grads = mem.lora;
        mem.adam = 2 * mem.lora;
        mem.training = mem.weights + (w.recompute ? mem.act_train_recompute : mem.act_train) +
                       mem.lora + mem.lora_grads + mem.adam + mem.reserve;
    }
    mem.peak = std::max(mem.inference, mem.training);
    if (!w.inference && !w.training)
        mem.peak = mem.weights + mem.reserve;
}

}  // namespace hymoe::runtime::detail
