// The KDA recurrence and decay gate on the device (hymoe/backend/cuda_ops.h). The recurrence is
// ops::kda_recurrent's arithmetic per column: for each token, S' = e^{g} ⊙ S,
// u = β (v − S'ᵀk), S = S' + k uᵀ, o = Sᵀq. Column y of head h needs only column y of S_h, so one
// thread owns it; the state stays fp32 in global memory (coalesced across the columns of a warp)
// and carries over to the next call. The gate is one thread per element. The batched recurrence
// (cuda_kda_batch.h kda_scan_batch) picks its kernel here: the fused decode step or chunked
// prefill (cuda_fused.h) where they apply, else the same column recurrence for every sequence of
// the table in one launch.
#include "../kda_scan_args.h"
#include "hymoe/backend/cuda_fused.h"
#include "hymoe/backend/cuda_kda_batch.h"
#include "hymoe/backend/cuda_ops.h"
#include "kernels.h"

namespace hymoe::backend::cuda {

namespace {

// Column y of head h through T tokens from row pointers at the sequence's first row; S points at
// column y of S_h ([K, V] row-major: S[x·V]).
__device__ inline void column_recurrence(const float* q,
                                         const float* k,
                                         const float* v,
                                         const float* g,
                                         const float* beta,
                                         float* o,
                                         float* S,
                                         int64_t T,
                                         int64_t H,
                                         int64_t K,
                                         int64_t V,
                                         int64_t h,
                                         int64_t y) {
    for (int64_t t = 0; t < T; ++t) {
        const float* qt = q + (t * H + h) * K;
        const float* kt = k + (t * H + h) * K;
        const float* gt = g + (t * H + h) * K;
        float u = 0.0f;
        for (int64_t x = 0; x < K; ++x) {  // S' = e^g ⊙ S; u = S'ᵀk
            const float s = S[x * V] * expf(gt[x]);
            S[x * V] = s;
            u += kt[x] * s;
        }
        u = beta[t * H + h] * (v[(t * H + h) * V + y] - u);
        float acc = 0.0f;
        for (int64_t x = 0; x < K; ++x) {  // S = S' + k uᵀ; o = Sᵀq
            const float s = S[x * V] + kt[x] * u;
            S[x * V] = s;
            acc += qt[x] * s;
        }
        o[(t * H + h) * V + y] = acc;
    }
}

__global__ void kda_recurrent_kernel(const ops::KdaScanParams p) {
    const int64_t H = p.n_head, K = p.d_k, V = p.d_v;
    for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < H * V;
         j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t h = j / V, y = j % V;
        column_recurrence(
            p.q, p.k, p.v, p.g, p.beta, p.o, p.S + h * K * V + y, p.n_tok, H, K, V, h, y);
    }
}

// One thread per (sequence, head, value column), through the sequence's rows.
__global__ void kda_scan_batch_kernel(const ops::KdaSeqTable t, const ops::KdaBatchScan p) {
    const int64_t H = p.n_head, K = p.d_k, V = p.d_v;
    for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
         j < t.n_seq * H * V;
         j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t s = j / (H * V), h = (j / V) % H, y = j % V, r = t.offsets[s];
        column_recurrence(p.q + r * H * K,
                          p.k + r * H * K,
                          p.v + r * H * V,
                          p.g + r * H * K,
                          p.beta + r * H,
                          p.o + r * H * V,
                          t.state[s] + h * K * V + y,
                          t.offsets[s + 1] - r,
                          H,
                          K,
                          V,
                          h,
                          y);
    }
}

// g ← −a·softplus(z) or lb·σ(a·z), z = g + dt_bias, a = e^{a_log[h]}
__global__ void decay_gate_kernel(float* g,
                                  const float* a_log,
                                  const float* dt_bias,
                                  int64_t n_tok,
                                  int64_t H,
                                  int64_t K,
                                  bool has_lb,
                                  float lb) {
    const int64_t D = H * K;
    for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < n_tok * D;
         j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t i = j % D;
        const float a = expf(a_log[i / K]);
        const float z = g[j] + dt_bias[i];
        const float softplus = z > 20.0f ? z : log1pf(expf(z));
        g[j] = has_lb ? lb * (1.0f / (1.0f + expf(-(a * z)))) : -a * softplus;
    }
}

}  // namespace

void kda_decay_gate(const Stream& s,
                    Tensor& g,
                    const Tensor& a_log,
                    const Tensor& dt_bias,
                    bool has_lower_bound,
                    float lower_bound) {
    check_float(g, "kda_decay_gate", DType::f32);
    check_float(a_log, "kda_decay_gate", DType::f32);
    check_float(dt_bias, "kda_decay_gate", DType::f32);
    const int64_t H = a_log.numel(), D = dt_bias.numel();
    HYMOE_CHECK(H > 0 && D % H == 0 && g.dim(-1) == D,
                "kda_decay_gate: g ",
                shape_string(g.shape),
                " a_log ",
                shape_string(a_log.shape),
                " dt_bias ",
                shape_string(dt_bias.shape));
    const int64_t n_tok = g.numel() / D;
    if (n_tok == 0)
        return;
    decay_gate_kernel<<<grid_for(n_tok * D, kBlock), kBlock, 0, s.get()>>>(g.ptr<float>(),
                                                                           a_log.ptr<float>(),
                                                                           dt_bias.ptr<float>(),
                                                                           n_tok,
                                                                           H,
                                                                           D / H,
                                                                           has_lower_bound,
                                                                           lower_bound);
    check_launch("kda_decay_gate");
}

void kda_recurrent(const Stream& s, const ops::KdaScanParams& p) {
    ops::detail::kda_scan_check("kda_recurrent", p);
    if (p.n_tok == 0)
        return;
    const int64_t columns = static_cast<int64_t>(p.n_head) * p.d_v;
    kda_recurrent_kernel<<<grid_for(columns, kBlock), kBlock, 0, s.get()>>>(p);
    check_launch("kda_recurrent");
}

void kda_scan_batch(const Stream& s, const ops::KdaSeqTable& t, const ops::KdaBatchScan& p) {
    HYMOE_CHECK(p.n_head > 0 && p.d_k > 0 && p.d_v > 0 && t.n_seq >= 0 && t.n_tok >= 0,
                "kda_scan_batch: H ",
                p.n_head,
                " K ",
                p.d_k,
                " V ",
                p.d_v,
                ", ",
                t.n_seq,
                " sequences");
    if (t.n_seq == 0 || t.n_tok == 0)
        return;
    HYMOE_CHECK(t.offsets && t.state && p.q && p.k && p.v && p.g && p.beta && p.o,
                "kda_scan_batch: missing table, input or output array");
    if (t.pool != nullptr && t.slot != nullptr) {  // the fused kernels address states as slots
        KdaBatchParams f;
        f.n_seq = static_cast<int>(t.n_seq);
        f.n_head = p.n_head;
        f.d_k = p.d_k;
        f.d_v = p.d_v;
        f.seq_start = t.offsets;
        f.state_slot = t.slot;
        f.q = p.q;
        f.k = p.k;
        f.v = p.v;
        f.g = p.g;
        f.beta = p.beta;
        f.S = t.pool;
        f.o = p.o;
        if (t.max_len == 1 && t.n_tok == t.n_seq && p.d_k <= 128)
            return kda_decode_step(s, f);
        if (p.bf16_products && t.max_len >= p.chunk_from &&
            kda_chunk_layout(p.d_k, p.d_v).supported)
            return kda_chunk_prefill(s, f);
    }
    const int64_t columns = t.n_seq * p.n_head * p.d_v;
    kda_scan_batch_kernel<<<grid_for(columns, kBlock), kBlock, 0, s.get()>>>(t, p);
    check_launch("kda_scan_batch");
}

}  // namespace hymoe::backend::cuda
