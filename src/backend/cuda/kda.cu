// The KDA recurrence on the device (hymoe/backend/cuda_ops.h), model::kda_recurrent's arithmetic
// per column: for each token, S' = e^{g} ⊙ S, u = β (v − S'ᵀk), S = S' + k uᵀ, o = Sᵀq. Column y
// of head h needs only column y of S_h, so one thread owns it; the state stays fp32 in global
// memory (coalesced across the columns of a warp) and carries over to the next call.
#include "hymoe/backend/cuda_ops.h"
#include "hymoe/model/kda.h"
#include "kernels.h"

namespace hymoe::backend::cuda {

namespace {

__global__ void kda_recurrent_kernel(const model::KdaScanParams p) {
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

}  // namespace

void kda_recurrent(const Stream& s, const model::KdaScanParams& p) {
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
