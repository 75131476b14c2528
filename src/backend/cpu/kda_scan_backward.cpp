// The backward of the KDA recurrence (spec/model-math.md §3, §9) on one sequence, every head, in
// fp32, token by token (ops::kda_scan_backward_tokens: the reference of the chunked backward,
// kda_chunk_backward.cpp). Forward per head and token: S' = e^{g} ⊙ S_{t−1} (row-wise),
// p = S'ᵀk, u = β(v − p), S_t = S' + k uᵀ, o_t = S_tᵀ q. Its reverse step, with dS = ∂L/∂S_t from
// the later tokens:
//   dS += q dOᵀ;  dq = S_t dO;  du = dSᵀ k;  dk = dS u;  dβ = du·(v − p);  dv = β du;
//   dp = −β du;  dS' = dS + k dpᵀ;  dk += S' dp;  dg = rowsum(dS' ⊙ S');  dS ← e^{g} ⊙ dS'.
// The states S_{t−1} come from a recompute, forward from the state saved at the start of the
// chunk, never from inverting the decay (e^{−g} overflows under strong decay); every factor the
// sweep applies is e^{g} ≤ 1, so the gradients stay finite however strong the decay. Memory: the
// checkpoints [⌈T/C⌉, H, K, V] and one head's states of one chunk [C + 1, K, V].
#include <algorithm>
#include <cmath>
#include <vector>

#include "../kda_scan_args.h"
#include "hymoe/backend/ops.h"
#include "hymoe/core/error.h"
#include "kda_chunk.h"

namespace hymoe::ops {

namespace {

// One head's recomputed forward over one chunk of L ≤ C tokens.
struct ChunkStates {
    std::vector<float> S;  // [C + 1, K, V] S[0] the checkpoint, S[i + 1] the state after token i
    std::vector<float> p;  // [C, V] S'ᵀk of token i
    std::vector<float> u;  // [C, V] β(v − p) of token i
    ChunkStates(int64_t C, int64_t K, int64_t V) : S((C + 1) * K * V), p(C * V), u(C * V) {}
};

// Token t of head h: row pointers into the [T, H, ·] arrays.
struct TokenRows {
    const float *q, *k, *v, *g;  // [K], [K], [V], [K]
    float beta;
    TokenRows(const KdaScanParams& p, int64_t t, int64_t h)
        : q(p.q + (t * p.n_head + h) * p.d_k),
          k(p.k + (t * p.n_head + h) * p.d_k),
          v(p.v + (t * p.n_head + h) * p.d_v),
          g(p.g + (t * p.n_head + h) * p.d_k),
          beta(p.beta[t * p.n_head + h]) {}
};

// The states of head h over tokens [t0, t0 + L), forward from the checkpoint S0 [K, V].
void recompute_chunk(
    const KdaScanParams& p, int64_t h, int64_t t0, int64_t L, const float* S0, ChunkStates& cs) {
    const int64_t K = p.d_k, V = p.d_v;
    std::copy(S0, S0 + K * V, cs.S.begin());
    for (int64_t i = 0; i < L; ++i) {
        const TokenRows r(p, t0 + i, h);
        const float* prev = &cs.S[i * K * V];
        float* next = &cs.S[(i + 1) * K * V];
        float* pv = &cs.p[i * V];
        float* u = &cs.u[i * V];
        std::fill(pv, pv + V, 0.0f);
        for (int64_t x = 0; x < K; ++x) {  // next = S' = e^g ⊙ prev; p = S'ᵀk
            const float e = std::exp(r.g[x]);
            for (int64_t y = 0; y < V; ++y) {
                next[x * V + y] = e * prev[x * V + y];
                pv[y] += r.k[x] * next[x * V + y];
            }
        }
        for (int64_t y = 0; y < V; ++y)
            u[y] = r.beta * (r.v[y] - pv[y]);
        for (int64_t x = 0; x < K; ++x)  // S_t = S' + k uᵀ
            for (int64_t y = 0; y < V; ++y)
                next[x * V + y] += r.k[x] * u[y];
    }
}

// The reverse step of token t = t0 + i of head h; dS [K, V] in: ∂L/∂S_t, out: ∂L/∂S_{t−1}.
void step_backward(const KdaScanParams& p,
                   const KdaScanGrads& d,
                   int64_t h,
                   int64_t t0,
                   int64_t i,
                   const ChunkStates& cs,
                   float* dS,
                   std::vector<float>& du) {  // [V] scratch
    const int64_t K = p.d_k, V = p.d_v, H = p.n_head, t = t0 + i;
    const TokenRows r(p, t, h);
    const float* prev = &cs.S[i * K * V];  // S_{t−1}
    const float* cur = &cs.S[(i + 1) * K * V];
    const float* pv = &cs.p[i * V];
    const float* u = &cs.u[i * V];
    const float* dO = d.dO + (t * H + h) * V;
    float* dq = d.dq + (t * H + h) * K;
    float* dk = d.dk + (t * H + h) * K;
    float* dv = d.dv + (t * H + h) * V;
    float* dg = d.dg + (t * H + h) * K;
    for (int64_t x = 0; x < K; ++x) {  // dq = S_t dO; dS += q dOᵀ
        float acc = 0.0f;
        for (int64_t y = 0; y < V; ++y) {
            acc += cur[x * V + y] * dO[y];
            dS[x * V + y] += r.q[x] * dO[y];
        }
        dq[x] = acc;
    }
    std::fill(du.begin(), du.end(), 0.0f);
    for (int64_t x = 0; x < K; ++x) {  // du = dSᵀk; dk = dS u
        float acc = 0.0f;
        for (int64_t y = 0; y < V; ++y) {
            du[y] += dS[x * V + y] * r.k[x];
            acc += dS[x * V + y] * u[y];
        }
        dk[x] = acc;
    }
    float dbeta = 0.0f;
    for (int64_t y = 0; y < V; ++y) {  // dβ = du·(v − p); dv = β du; du ← dp = −β du
        dbeta += du[y] * (r.v[y] - pv[y]);
        dv[y] = r.beta * du[y];
        du[y] *= -r.beta;
    }
    d.dbeta[t * H + h] = dbeta;
    for (int64_t x = 0; x < K; ++x) {  // dS' = dS + k dpᵀ; dk += S' dp; dg = Σ dS'⊙S'; dS = e^g dS'
        const float e = std::exp(r.g[x]);
        float acc_k = 0.0f, acc_g = 0.0f;
        for (int64_t y = 0; y < V; ++y) {
            const float dsp = dS[x * V + y] + r.k[x] * du[y];
            const float sp = e * prev[x * V + y];
            acc_k += sp * du[y];
            acc_g += dsp * sp;
            dS[x * V + y] = e * dsp;
        }
        dk[x] += acc_k;
        dg[x] = acc_g;
    }
}

}  // namespace

void kda_chunked_checkpoints(const KdaScanParams& p, float* ckpt, int chunk) {
    HYMOE_CHECK(
        chunk > 0 && ckpt != nullptr && p.S != nullptr, "kda_chunked_checkpoints: chunk ", chunk);
    const int64_t H = p.n_head, K = p.d_k, V = p.d_v, HKV = H * K * V;
    KdaScanParams c = p;
    for (int64_t t0 = 0, i = 0; t0 < p.n_tok; t0 += chunk, ++i) {
        std::copy(p.S, p.S + HKV, ckpt + i * HKV);
        c.n_tok = std::min<int64_t>(chunk, p.n_tok - t0);
        c.q = p.q + t0 * H * K;
        c.k = p.k + t0 * H * K;
        c.v = p.v + t0 * H * V;
        c.g = p.g + t0 * H * K;
        c.beta = p.beta + t0 * H;
        c.o = p.o + t0 * H * V;
        kda_chunked(c, chunk);
    }
}

void kda_scan_backward_tokens(const KdaScanParams& p,
                              const float* ckpt,
                              const KdaScanGrads& d,
                              int chunk) {
    if (!detail::kda_backward_args_ok("kda_scan_backward_tokens", p, ckpt, d, chunk))
        return;
    const int64_t H = p.n_head, K = p.d_k, V = p.d_v, C = chunk;
    const int64_t n_chunk = (p.n_tok + C - 1) / C;
    std::vector<float> dS(H * K * V, 0.0f);  // [H, K, V] ∂L/∂S after the token being swept
    std::vector<float> du(V);
    ChunkStates cs(C, K, V);
    for (int64_t c = n_chunk - 1; c >= 0; --c) {
        const int64_t t0 = c * C, L = std::min(C, p.n_tok - t0);
        for (int64_t h = 0; h < H; ++h) {
            recompute_chunk(p, h, t0, L, ckpt + (c * H + h) * K * V, cs);
            for (int64_t i = L - 1; i >= 0; --i)
                step_backward(p, d, h, t0, i, cs, &dS[h * K * V], du);
        }
    }
}

}  // namespace hymoe::ops
