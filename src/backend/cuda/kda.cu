// The KDA recurrence and decay gate on the device (hymoe/backend/cuda_ops.h). The recurrence is
// ops::kda_recurrent's arithmetic per column: for each token, S' = e^{g} ⊙ S,
// u = β (v − S'ᵀk), S = S' + k uᵀ, o = Sᵀq. Column y of head h needs only column y of S_h, so one
// thread owns it; the state stays fp32 in global memory (coalesced across the columns of a warp)
// and carries over to the next call. The gate is one thread per element.
#include "hymoe/backend/cuda_ops.h"
#include "kernels.h"

namespace hymoe::backend::cuda {

namespace {

__global__ void kda_recurrent_kernel(const ops::KdaScanParams p) {
    const int64_t H = p.n_head, K = p.d_k, V = p.d_v;
    for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < H * V;
         j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t h = j / V, y = j % V;
        float* S = p.S + h * K * V + y;  // column y of S_h: S[x * V]
        for (int64_t t = 0; t < p.n_tok; ++t) {
            const float* q = p.q + (t * H + h) * K;
            const float* k = p.k + (t * H + h) * K;
            const float* g = p.g + (t * H + h) * K;
            float u = 0.0f;
            for (int64_t x = 0; x < K; ++x) {  // S' = e^g ⊙ S; u = S'ᵀk
                const float s = S[x * V] * expf(g[x]);
                S[x * V] = s;
                u += k[x] * s;
            }
            u = p.beta[t * H + h] * (p.v[(t * H + h) * V + y] - u);
            float o = 0.0f;
            for (int64_t x = 0; x < K; ++x) {  // S = S' + k uᵀ; o = Sᵀq
                const float s = S[x * V] + k[x] * u;
                S[x * V] = s;
                o += q[x] * s;
            }
            p.o[(t * H + h) * V + y] = o;
        }
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
    HYMOE_CHECK(p.n_tok >= 0 && p.n_head > 0 && p.d_k > 0 && p.d_v > 0 && p.S != nullptr,
                "kda_recurrent: T ",
                p.n_tok,
                " H ",
                p.n_head,
                " K ",
                p.d_k,
                " V ",
                p.d_v);
    HYMOE_CHECK(p.n_tok == 0 || (p.q && p.k && p.v && p.g && p.beta && p.o),
                "kda_recurrent: missing input or output array");
    if (p.n_tok == 0)
        return;
    const int64_t columns = static_cast<int64_t>(p.n_head) * p.d_v;
    kda_recurrent_kernel<<<grid_for(columns, kBlock), kBlock, 0, s.get()>>>(p);
    check_launch("kda_recurrent");
}

}  // namespace hymoe::backend::cuda
