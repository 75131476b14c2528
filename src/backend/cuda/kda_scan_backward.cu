// One sequence's KDA recurrence backward on the device (hymoe/backend/cuda_kda_backward.h), the
// token-by-token form of backend/cpu/kda_scan_backward.cpp: one thread block per head, sequential
// over the chunks in reverse and over each chunk's tokens. Each chunk's states are recomputed
// forward from its checkpoint into the caller's workspace (threads over value columns: a column
// of S evolves on its own), then swept back with ∂L/∂S [K, V] carried across chunks: the per-row
// sums (dq, dk, dg) with threads over rows of K, du = dSᵀk with threads over columns (summed over
// K in the CPU's order), dβ by one thread. fp32; expf as the CPU's std::exp.
#include "../kda_scan_args.h"
#include "hymoe/backend/cuda_kda_backward.h"
#include "kernels.h"

namespace hymoe::backend::cuda {

namespace {

struct HeadWork {
    float* S;   // [C + 1, K, V] S[0] the checkpoint, S[i + 1] the state after token i
    float* p;   // [C, V] S'ᵀk of token i
    float* u;   // [C, V] β(v − p)
    float* dS;  // [K, V] ∂L/∂S after the token being swept
    float* du;  // [V]
};

// Floats of one head's workspace: S (C + 1)·K·V, p and u C·V each, dS K·V, du V.
__host__ __device__ inline int64_t head_floats(int64_t K, int64_t V, int64_t C) {
    return (C + 2) * K * V + 2 * C * V + V;
}

__device__ HeadWork head_work(float* work, int64_t h, int64_t C, int64_t K, int64_t V) {
    float* w = work + h * head_floats(K, V, C);
    const int64_t s = (C + 1) * K * V;
    return {w, w + s, w + s + C * V, w + s + 2 * C * V, w + s + 2 * C * V + K * V};
}

__global__ void scan_backward_kernel(
    ops::KdaScanParams p, const float* ckpt, ops::KdaScanGrads d, int chunk, float* work) {
    const int64_t h = blockIdx.x, H = p.n_head, K = p.d_k, V = p.d_v, C = chunk;
    const int64_t tid = threadIdx.x, nt = blockDim.x;
    const HeadWork w = head_work(work, h, C, K, V);
    for (int64_t j = tid; j < K * V; j += nt)
        w.dS[j] = 0.0f;
    const int64_t n_chunk = (p.n_tok + C - 1) / C;
    for (int64_t c = n_chunk - 1; c >= 0; --c) {
        const int64_t t0 = c * C, L = min(C, p.n_tok - t0);
        __syncthreads();
        for (int64_t j = tid; j < K * V; j += nt)
            w.S[j] = ckpt[(c * H + h) * K * V + j];
        __syncthreads();
        for (int64_t y = tid; y < V; y += nt)  // recompute: each thread its own column
            for (int64_t i = 0; i < L; ++i) {
                const int64_t r = (t0 + i) * H + h;
                const float* k = p.k + r * K;
                const float* g = p.g + r * K;
                const float* prev = w.S + i * K * V;
                float* next = w.S + (i + 1) * K * V;
                float acc = 0.0f;
                for (int64_t x = 0; x < K; ++x) {
                    next[x * V + y] = expf(g[x]) * prev[x * V + y];
                    acc += k[x] * next[x * V + y];
                }
                const float u = p.beta[r] * (p.v[r * V + y] - acc);
                w.p[i * V + y] = acc;
                w.u[i * V + y] = u;
                for (int64_t x = 0; x < K; ++x)
                    next[x * V + y] += k[x] * u;
            }
        __syncthreads();
        for (int64_t i = L - 1; i >= 0; --i) {
            const int64_t r = (t0 + i) * H + h;
            const float *q = p.q + r * K, *k = p.k + r * K, *g = p.g + r * K, *v = p.v + r * V;
            const float beta = p.beta[r];
            const float* prev = w.S + i * K * V;
            const float* cur = w.S + (i + 1) * K * V;
            const float* pv = w.p + i * V;
            const float* u = w.u + i * V;
            const float* dO = d.dO + r * V;
            for (int64_t x = tid; x < K; x += nt) {  // dq = S_t dO; dS += q dOᵀ
                float acc = 0.0f;
                for (int64_t y = 0; y < V; ++y) {
                    acc += cur[x * V + y] * dO[y];
                    w.dS[x * V + y] += q[x] * dO[y];
                }
                d.dq[r * K + x] = acc;
            }
            __syncthreads();
            for (int64_t y = tid; y < V; y += nt) {  // du = dSᵀk
                float acc = 0.0f;
                for (int64_t x = 0; x < K; ++x)
                    acc += w.dS[x * V + y] * k[x];
                w.du[y] = acc;
            }
            for (int64_t x = tid; x < K; x += nt) {  // dk = dS u
                float acc = 0.0f;
                for (int64_t y = 0; y < V; ++y)
                    acc += w.dS[x * V + y] * u[y];
                d.dk[r * K + x] = acc;
            }
            __syncthreads();
            if (tid == 0) {  // dβ = du·(v − p); dv = β du; du ← dp = −β du
                float db = 0.0f;
                for (int64_t y = 0; y < V; ++y) {
                    db += w.du[y] * (v[y] - pv[y]);
                    d.dv[r * V + y] = beta * w.du[y];
                    w.du[y] *= -beta;
                }
                d.dbeta[r] = db;
            }
            __syncthreads();
            for (int64_t x = tid; x < K;
                 x += nt) {  // dS' = dS + k dpᵀ; dk += S' dp; dg; dS = e^g dS'
                const float e = expf(g[x]);
                float acc_k = 0.0f, acc_g = 0.0f;
                for (int64_t y = 0; y < V; ++y) {
                    const float dsp = w.dS[x * V + y] + k[x] * w.du[y];
                    const float sp = e * prev[x * V + y];
                    acc_k += sp * w.du[y];
                    acc_g += dsp * sp;
                    w.dS[x * V + y] = e * dsp;
                }
                d.dk[r * K + x] += acc_k;
                d.dg[r * K + x] = acc_g;
            }
            __syncthreads();
        }
    }
}

}  // namespace

int64_t kda_scan_backward_work(int n_head, int d_k, int d_v, int chunk) {
    return n_head * head_floats(d_k, d_v, chunk);
}

void kda_scan_backward(const Stream& s,
                       const ops::KdaScanParams& p,
                       const float* ckpt,
                       const ops::KdaScanGrads& d,
                       int chunk,
                       float* work) {
    if (!ops::detail::kda_backward_args_ok("kda_scan_backward", p, ckpt, d, chunk))
        return;
    HYMOE_CHECK(work, "kda_scan_backward: no workspace array");
    scan_backward_kernel<<<static_cast<unsigned>(p.n_head), 128, 0, s.get()>>>(
        p, ckpt, d, chunk, work);
    check_launch("kda_scan_backward");
}

}  // namespace hymoe::backend::cuda
