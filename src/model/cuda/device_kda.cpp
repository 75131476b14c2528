// The KDA block on the GPU (device_blocks.h kda_block), model::kda_forward's steps over the whole
// packed batch at once: q|k|v = x W_qkvᵀ (one GEMM) → causal conv + SiLU per sequence from its
// tail (one launch, planes q, k, v) → l2 per head, q × K^{-1/2}; f_a|g_a|b = x W_lowᵀ (one GEMM),
// g = decay(f_b f_a x), β = σ(b x), gate = σ(g_b g_a x); the recurrence of every sequence (one
// launch: the fused decode step or chunked prefill where they apply, cuda_fused.h, else the
// generic scan); y = o_proj(RMSNorm(o_h; o_norm) ⊙ gate).
#include <cmath>

#include "device_blocks.h"
#include "hymoe/backend/cuda_fused.h"
#include "hymoe/backend/cuda_ops.h"

namespace hymoe::model::gpu {

namespace {

// The recurrence through a fused kernel when one applies: a decode step (one row per sequence,
// K ≤ 128, fp32 arithmetic) or, with bf16 matrices, the chunked prefill (K a multiple of 16 up to
// 128: its bf16 tensor-core products are within the bf16 model's tolerance, not the fp32 one's).
// False: none applies and nothing was queued.
bool fused_recurrence(Gpu& g, const StepBatch& step, DType cd, const cu::KdaBatchParams& p) {
    if (!step.fused || step.kda_pool == nullptr)
        return false;
    if (step.n_tok == step.n_seq && p.d_k <= 128) {
        cu::kda_decode_step(g.stream, p);
        return true;
    }
    if (cd == DType::bf16 && cu::kda_chunk_layout(p.d_k, p.d_v).supported) {
        cu::kda_chunk_prefill(g.stream, p);
        return true;
    }
    return false;
}

}  // namespace

void kda_block(Gpu& g,
               const ModelConfig& cfg,
               const KdaW& w,
               const Tensor& x,
               const StepBatch& step,
               int kda_index,
               DType cd,
               Tensor& y) {
    const int64_t n = step.n_tok, H = cfg.kda.n_head, K = cfg.kda.head_dim, D = H * K;
    const int64_t n_low = 2 * K + H;
    const cu::Stream& st = g.stream;
    Scratch s(g.arena);
    const cu::KdaBatch b{n,
                         step.n_seq,
                         static_cast<int>(H),
                         static_cast<int>(K),
                         cfg.kda.conv_kernel,
                         step.offsets.ptr<int64_t>(),
                         step.row_seq.ptr<int32_t>(),
                         step.kda_states.ptr<float*>() + kda_index * step.n_seq,
                         step.kda_states.ptr<float*>() + (step.n_kda + kda_index) * step.n_seq};

    // q, k, v: projection → conv (continuing each tail) → SiLU → l2 per head, q × K^{-1/2}
    const Tensor xc = in_dtype(g, s, x, cd);
    Tensor u = s(DType::f32, {n, 3 * D});       // [n, 3D] pre-conv q|k|v
    Tensor qkv = s(DType::f32, {3, n * H, K});  // planes q, k, v, each [n, H, K]
    g.blas.linear(xc, w.qkv, u);
    lora_apply(g, w.lora.q, step.lora.rows, x, u, 0);  // adapters on q | k | v (f32 input)
    lora_apply(g, w.lora.k, step.lora.rows, x, u, D);
    lora_apply(g, w.lora.v, step.lora.rows, x, u, 2 * D);
    cu::kda_conv_silu(st, b, u.ptr<float>(), w.conv.ptr<float>(), qkv.ptr<float>());
    cu::kda_conv_tails(st, b, u.ptr<float>());
    Tensor q{qkv.data, DType::f32, Device::cuda, {n * H, K}};
    Tensor k{at(qkv, n * D), DType::f32, Device::cuda, {n * H, K}};
    const float* v = static_cast<const float*>(at(qkv, 2 * n * D));
    cu::l2_norm_rows(st, q);
    cu::l2_norm_rows(st, k);
    cu::scale_inplace(st, q, 1.0f / std::sqrt(static_cast<float>(K)));

    // g = decay(f_b f_a x), β = σ(b_proj x), gate = σ(g_b g_a x)
    Tensor low = s(DType::f32, {n, n_low});  // [n, 2K + H] f_a x | g_a x | b x
    g.blas.linear(xc, w.low, low);
    const Tensor lowc = in_dtype(g, s, low, cd);
    Tensor decay = s(DType::f32, {n, D});
    g.blas.gemm(cd,
                DType::f32,
                false,
                true,
                n,
                D,
                K,
                1.0f,
                lowc.data,
                n_low,
                w.f_b.data,
                K,
                0.0f,
                decay.data,
                D);
    cu::kda_decay_gate(st,
                       decay,
                       w.a_log,
                       w.dt_bias,
                       cfg.kda.gate_lower_bound.has_value(),
                       static_cast<float>(cfg.kda.gate_lower_bound.value_or(0.0)));
    Tensor beta = s(DType::f32, {n, H});
    cu::copy_2d(st, DType::f32, at(low, 2 * K), n_low, beta.data, H, n, H);
    cu::sigmoid_inplace(st, beta);
    Tensor gate = s(DType::f32, {n, D});
    g.blas.gemm(cd,
                DType::f32,
                false,
                true,
                n,
                D,
                K,
                1.0f,
                at(lowc, K),
                n_low,
                w.g_b.data,
                K,
                0.0f,
                gate.data,
                D);
    cu::sigmoid_inplace(st, gate);

    Tensor o = s(DType::f32, {n * H, K});  // [n, H, V]
    cu::KdaBatchParams p;
    p.n_seq = static_cast<int>(step.n_seq);
    p.n_head = static_cast<int>(H);
    p.d_k = p.d_v = static_cast<int>(K);
    p.seq_start = step.offsets.ptr<int64_t>();
    p.state_slot = step.kda_pool ? step.kda_slots.ptr<int32_t>() + kda_index * step.n_seq : nullptr;
    p.q = q.data;
    p.k = k.data;
    p.v = v;
    p.g = decay.ptr<float>();
    p.beta = beta.ptr<float>();
    p.S = step.kda_pool;
    p.o = o.data;
    if (!fused_recurrence(g, step, cd, p))
        cu::kda_scan(st,
                     b,
                     q.ptr<float>(),
                     k.ptr<float>(),
                     v,
                     decay.ptr<float>(),
                     beta.ptr<float>(),
                     o.ptr<float>());

    // y = o_proj(RMSNorm(o_h; o_norm) ⊙ gate)
    cu::rms_norm(st, o, w.o_norm, static_cast<float>(cfg.rms_norm_eps), o);
    cu::mul_inplace(st, o, gate);
    o.shape = {n, D};
    g.blas.linear(in_dtype(g, s, o, cd), w.o_proj, y);
    lora_apply(g, w.lora.o, step.lora.rows, o, y);
}

}  // namespace hymoe::model::gpu
