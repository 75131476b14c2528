// The backward of the chunked KDA form (spec/model-math.md §3, §9) on one sequence, every head, in
// fp32, as GEMMs per chunk and head (the structure of fla's chunk_kda backward). A reverse sweep
// over the chunks: each chunk's intra-chunk matrices are recomputed from its checkpoint S (the
// state before it) with the forward's own code (kda_chunk.h), then, with dO its rows of ∂L/∂o and
// dS' = ∂L/∂(state after the chunk) (zero after the last one), per head:
//   dV' = Aqkᵀ dO + K_L dS'            (K_L = K ⊙ e^{Γ_L − Γ}, K_g = K ⊙ e^Γ, Q_g = Q ⊙ e^Γ)
//   ∂L/∂S = Q_gᵀ dO + e^{Γ_L} ⊙ dS' − Wᵀ dV'          (carried to the chunk before)
//   dW = −dV' Sᵀ,  dT = tril(dV' Vᵀ + dW K_gᵀ),  dV = Tᵀ dV',  dK_g = Tᵀ dW,
//   dβ_j = Σ_i dT_ij N_ij,  dN = dT Diag(β),  dM = stril(−Nᵀ dN Nᵀ),
//   dβ_c += Σ_i dM_ci A_kk,ci,  dA_kk = Diag(β) dM,  dAqk = tril(dO V'ᵀ),
//   dQ_g = dO Sᵀ,  dK_L = V' dS'ᵀ,
// and the scores' gradients through their pairwise decays, for D = dAqk or dA_kk,
//   row form  Σ_j D_cj k_j ⊙ e^{Γ_c − Γ_j},   column form  Σ_c D_cj a_c ⊙ e^{Γ_c − Γ_j} (a = q, k),
// by sub-chunks I of 16 rows from r as the forward: the block row left of I as GEMMs of factors
// about Γ_r (e^{Γ_I − Γ_r}, e^{Γ_r − Γ_{<r}}: exponents ≤ 0), the diagonal block with exact
// pairwise exponentials. dΓ gathers every path (q ⊙ ∂L/∂(q-decay) − k ⊙ ..., and the Γ_L terms of
// the state update), and dg is its reverse cumulative sum within the chunk. Every exponential
// evaluated is e^x with x ≤ 0, so the gradients stay finite however strong the decay.
#include <algorithm>
#include <vector>

#include "../kda_scan_args.h"
#include "hymoe/backend/ops.h"
#include "hymoe/core/error.h"
#include "kda_chunk.h"
#include "kda_simd.h"

namespace hymoe::ops {

namespace {

using namespace kda_chunk;

// The backward's own scratch for one chunk of one head (row strides K, V, C).
struct BackScratch {
    std::vector<float> S;     // [K, V] the state before the chunk (its checkpoint)
    std::vector<float> dS;    // [K, V] ∂L/∂S before the chunk
    std::vector<float> akk;   // [C, C] A_kk, strictly lower
    std::vector<float> n;     // [C, C] N = (I + M)^{-1}
    std::vector<float> dvp;   // [C, V] ∂L/∂V'
    std::vector<float> dw;    // [C, K] ∂L/∂W
    std::vector<float> dt;    // [C, C] ∂L/∂T, then ∂L/∂N
    std::vector<float> tmp;   // [C, C] dN Nᵀ
    std::vector<float> dm;    // [C, C] ∂L/∂M, then ∂L/∂A_kk
    std::vector<float> daqk;  // [C, C] ∂L/∂Aqk
    std::vector<float> dqg;   // [C, K] ∂L/∂Q_g, then ⊙ e^Γ
    std::vector<float> dkg;   // [C, K] ∂L/∂K_g, then ⊙ e^Γ
    std::vector<float> dkl;   // [C, K] ∂L/∂K_L, then ⊙ e^{Γ_L − Γ}
    std::vector<float> dqa;   // [C, K] row form of dAqk with K
    std::vector<float> dkr;   // [C, K] row form of dA_kk with K
    std::vector<float> dkc;   // [C, K] column forms: of dAqk with Q plus of dA_kk with K
    std::vector<float> dqd;   // [C, K] the diagonal of dAqk: dAqk_cc k_c (no decay, no dΓ)
    std::vector<float> dkd;   // [C, K] dAqk_cc q_c
    std::vector<float> acc;   // [C, K] a block's product before its decay factor
    std::vector<float> dgl;   // [K] ∂L/∂Γ_L from the state update
    BackScratch(int64_t C, int64_t K, int64_t V)
        : S(K * V),
          dS(K * V),
          akk(C * C),
          n(C * C),
          dvp(C * V),
          dw(C * K),
          dt(C * C),
          tmp(C * C),
          dm(C * C),
          daqk(C * C),
          dqg(C * K),
          dkg(C * K),
          dkl(C * K),
          dqa(C * K),
          dkr(C * K),
          dkc(C * K),
          dqd(C * K),
          dkd(C * K),
          acc(C * K),
          dgl(K) {}
};

// The forward's intra-chunk matrices from the checkpoint b.S: s.gam, qg, kg, kl ([L, K]), aqk, m
// (M), t (T), u (V') as kda_chunked computes them, w (W = T K_g), and b.akk (A_kk), b.n (N).
void recompute(const ChunkView& c, int64_t C, ChunkScratch& s, BackScratch& b) {
    const int64_t L = c.L;
    chunk_decays(c, s);
    kda_decay_backward(c.k, c.ldk, s.eg.data(), false, L, c.K, s.kl.data());  // K ⊙ e^{Γ_L − Γ}
    chunk_scores(c, C, s);
    for (int64_t i = 0; i < L; ++i)
        std::copy(&s.m[i * C], &s.m[i * C + L], &b.akk[i * C]);
    chunk_beta_rows(c, C, s);
    chunk_inverse(c, C, s);
    for (int64_t i = 0; i < L; ++i)
        std::copy(&s.t[i * C], &s.t[i * C + L], &b.n[i * C]);
    chunk_beta_columns(c, C, s);
    chunk_vprime(c, C, s, false);
    ops::gemm(false, false, L, c.K, L, 1.0f, s.t.data(), C, s.kg, c.K, 0.0f, s.w.data(), c.K);
}

// dV', ∂L/∂S before the chunk (b.dS), dW, dT → dN, dM → dA_kk, dAqk, dQ_g, dK_g, dK_L, dv and dβ,
// from dO (rows of stride ldv) and dS1 = ∂L/∂(state after the chunk).
void products(const ChunkView& c,
              int64_t C,
              const float* dO,
              const float* dS1,
              const ChunkScratch& s,
              BackScratch& b,
              float* dv,       // [L, V] stride ldv
              float* dbeta) {  // [L] stride H
    const int64_t L = c.L, K = c.K, V = c.V, ldv = c.ldv;
    const float* S = b.S.data();
    ops::gemm(true, false, L, V, L, 1.0f, s.aqk.data(), C, dO, ldv, 0.0f, b.dvp.data(), V);
    ops::gemm(false, false, L, V, K, 1.0f, s.kl.data(), K, dS1, V, 1.0f, b.dvp.data(), V);
    kda_exp(&s.gam[(L - 1) * K], b.dgl.data(), K);  // e^{Γ_L}, then ∂L/∂Γ_L
    for (int64_t x = 0; x < K; ++x) {
        float acc = 0.0f;
        for (int64_t y = 0; y < V; ++y) {
            b.dS[x * V + y] = b.dgl[x] * dS1[x * V + y];
            acc += b.dS[x * V + y] * S[x * V + y];
        }
        b.dgl[x] = acc;
    }
    ops::gemm(true, false, K, V, L, 1.0f, s.qg, K, dO, ldv, 1.0f, b.dS.data(), V);
    ops::gemm(true, false, K, V, L, -1.0f, s.w.data(), K, b.dvp.data(), V, 1.0f, b.dS.data(), V);
    ops::gemm(false, true, L, K, V, 1.0f, dO, ldv, S, V, 0.0f, b.dqg.data(), K);
    ops::gemm(false, true, L, K, V, 1.0f, s.u.data(), V, dS1, V, 0.0f, b.dkl.data(), K);
    ops::gemm(false, true, L, K, V, -1.0f, b.dvp.data(), V, S, V, 0.0f, b.dw.data(), K);
    ops::gemm(false, true, L, L, V, 1.0f, b.dvp.data(), V, c.v, ldv, 0.0f, b.dt.data(), C);
    ops::gemm(false, true, L, L, K, 1.0f, b.dw.data(), K, s.kg, K, 1.0f, b.dt.data(), C);
    ops::gemm(true, false, L, V, L, 1.0f, s.t.data(), C, b.dvp.data(), V, 0.0f, dv, ldv);
    ops::gemm(true, false, L, K, L, 1.0f, s.t.data(), C, b.dw.data(), K, 0.0f, b.dkg.data(), K);
    for (int64_t j = 0; j < L; ++j)
        dbeta[j * c.H] = 0.0f;
    for (int64_t i = 0; i < L; ++i) {  // dT on the lower triangle: dβ_j, then dN = dT Diag(β)
        for (int64_t j = 0; j <= i; ++j) {
            dbeta[j * c.H] += b.dt[i * C + j] * b.n[i * C + j];
            b.dt[i * C + j] *= c.beta[j * c.H];
        }
        std::fill(&b.dt[i * C + i + 1], &b.dt[i * C + L], 0.0f);
    }
    ops::gemm(false, true, L, L, L, 1.0f, b.dt.data(), C, b.n.data(), C, 0.0f, b.tmp.data(), C);
    ops::gemm(true, false, L, L, L, -1.0f, b.n.data(), C, b.tmp.data(), C, 0.0f, b.dm.data(), C);
    for (int64_t i = 0; i < L; ++i) {  // dM below the diagonal: dβ_c, then dA_kk = β_c dM
        const float beta = c.beta[i * c.H];
        float acc = 0.0f;
        for (int64_t j = 0; j < i; ++j) {
            acc += b.dm[i * C + j] * b.akk[i * C + j];
            b.dm[i * C + j] *= beta;
        }
        dbeta[i * c.H] += acc;
        std::fill(&b.dm[i * C + i], &b.dm[i * C + L], 0.0f);
    }
    ops::gemm(false, true, L, L, V, 1.0f, dO, ldv, s.u.data(), V, 0.0f, b.daqk.data(), C);
    for (int64_t i = 0; i < L; ++i)
        std::fill(&b.daqk[i * C + i + 1], &b.daqk[i * C + L], 0.0f);
}

// The row and column forms of dAqk and dA_kk (b.dqa, b.dkr, b.dkc) by sub-chunks, as in the
// file comment, but for the diagonal of dAqk (b.dqd, b.dkd): its terms have no decay and their
// dΓ parts cancel exactly, so they stay out of dΓ (no rounding left where dg is 0). s.qks,
// s.kt are the forward's buffers for the same factors.
void score_grads(const ChunkView& c, int64_t C, ChunkScratch& s, BackScratch& b) {
    const int64_t L = c.L, K = c.K;
    std::fill(b.dqa.begin(), b.dqa.begin() + L * K, 0.0f);
    std::fill(b.dkr.begin(), b.dkr.begin() + L * K, 0.0f);
    std::fill(b.dkc.begin(), b.dkc.begin() + L * K, 0.0f);
    const float* gam = s.gam.data();
    for (int64_t r = 0; r < L; r += sub) {
        const int64_t n = std::min(sub, L - r);
        const float* gr = gam + r * K;
        for (int64_t i = r; i < r + n; ++i) {  // the diagonal of dAqk
            const float a = b.daqk[i * C + i];
            for (int64_t x = 0; x < K; ++x) {
                b.dqd[i * K + x] = a * c.k[i * c.ldk + x];
                b.dkd[i * K + x] = a * c.q[i * c.ldk + x];
            }
        }
        kda_diag_grads(n,  // the diagonal block, pairwise: j < i in I
                       K,
                       c.q + r * c.ldk,
                       c.k + r * c.ldk,
                       c.ldk,
                       gr,
                       &b.daqk[r * C + r],
                       &b.dm[r * C + r],
                       C,
                       &b.dqa[r * K],
                       &b.dkr[r * K],
                       &b.dkc[r * K]);
        if (r == 0)
            continue;
        // rows I against the columns before r: (D_{I,<r} (K_{<r} ⊙ e^{Γ_r − Γ_{<r}})) ⊙ e^{Γ_I −
        // Γ_r}
        kda_decay_rows(c.k, c.ldk, gam, gr, -1.0f, r, K, s.kt.data());
        ops::gemm(
            false, false, n, K, r, 1.0f, &b.daqk[r * C], C, s.kt.data(), K, 0.0f, b.acc.data(), K);
        kda_decay_rows(b.acc.data(), K, gr, gr, 1.0f, n, K, b.acc.data());
        for (int64_t i = 0; i < n * K; ++i)
            b.dqa[r * K + i] += b.acc[i];
        ops::gemm(
            false, false, n, K, r, 1.0f, &b.dm[r * C], C, s.kt.data(), K, 0.0f, b.acc.data(), K);
        kda_decay_rows(b.acc.data(), K, gr, gr, 1.0f, n, K, b.acc.data());
        for (int64_t i = 0; i < n * K; ++i)
            b.dkr[r * K + i] += b.acc[i];
        // the columns before r from rows I: (D_{I,<r}ᵀ (A_I ⊙ e^{Γ_I − Γ_r})) ⊙ e^{Γ_r − Γ_{<r}}
        float* qs = s.qks.data();  // [n, K], then ks [n, K]
        kda_decay_rows(c.q + r * c.ldk, c.ldk, gr, gr, 1.0f, n, K, qs);
        kda_decay_rows(c.k + r * c.ldk, c.ldk, gr, gr, 1.0f, n, K, qs + n * K);
        ops::gemm(true, false, r, K, n, 1.0f, &b.daqk[r * C], C, qs, K, 0.0f, b.acc.data(), K);
        ops::gemm(
            true, false, r, K, n, 1.0f, &b.dm[r * C], C, qs + n * K, K, 1.0f, b.acc.data(), K);
        kda_decay_rows(b.acc.data(), K, gam, gr, -1.0f, r, K, b.acc.data());
        for (int64_t i = 0; i < r * K; ++i)
            b.dkc[i] += b.acc[i];
    }
}

// dq, dk, dg of the chunk's rows (stride ldk) from the pieces: with the decayed dQ_g, dK_g, dK_L,
//   dq = dqa + dqd + dQ_g,  dk = dkr + dkc + dkd + dK_g + dK_L,
//   dΓ = q ⊙ (dqa + dQ_g) + k ⊙ (dkr − dkc + dK_g − dK_L),  dΓ_L += Σ_t k_t ⊙ dK_L,t (+ the state
//   term),
// and dg the reverse cumulative sum of dΓ.
void assemble(
    const ChunkView& c, ChunkScratch& s, BackScratch& b, float* dq, float* dk, float* dg) {
    const int64_t L = c.L, K = c.K, ldk = c.ldk;
    const float* gam = s.gam.data();
    kda_decay_rows(b.dqg.data(), K, gam, nullptr, 1.0f, L, K, b.dqg.data());
    kda_decay_rows(b.dkg.data(), K, gam, nullptr, 1.0f, L, K, b.dkg.data());
    kda_decay_rows(b.dkl.data(), K, gam, gam + (L - 1) * K, -1.0f, L, K, b.dkl.data());
    for (int64_t t = 0; t < L; ++t) {
        const float* q = c.q + t * ldk;
        const float* k = c.k + t * ldk;
        for (int64_t x = 0; x < K; ++x) {
            const int64_t i = t * K + x;
            const float dqt = b.dqa[i] + b.dqg[i];
            dq[t * ldk + x] = dqt + b.dqd[i];
            dk[t * ldk + x] = b.dkr[i] + b.dkc[i] + b.dkg[i] + b.dkl[i] + b.dkd[i];
            s.gam[i] = q[x] * dqt + k[x] * (b.dkr[i] - b.dkc[i] + b.dkg[i] - b.dkl[i]);  // dΓ
            b.dgl[x] += k[x] * b.dkl[i];
        }
    }
    for (int64_t x = 0; x < K; ++x)
        s.gam[(L - 1) * K + x] += b.dgl[x];
    for (int64_t t = L - 1; t >= 0; --t)
        for (int64_t x = 0; x < K; ++x)
            dg[t * ldk + x] = s.gam[t * K + x] + (t + 1 < L ? dg[(t + 1) * ldk + x] : 0.0f);
}

}  // namespace

void kda_scan_backward(const KdaScanParams& p,
                       const float* ckpt,
                       const KdaScanGrads& d,
                       int chunk) {
    if (!detail::kda_backward_args_ok("kda_scan_backward", p, ckpt, d, chunk))
        return;
    const int64_t H = p.n_head, K = p.d_k, V = p.d_v, C = chunk;
    const int64_t n_chunk = (p.n_tok + C - 1) / C;
    std::vector<float> dS(H * K * V, 0.0f);  // [H, K, V] ∂L/∂S after the chunk being swept
    ChunkScratch s(C, K, V);
    BackScratch b(C, K, V);
    for (int64_t ci = n_chunk - 1; ci >= 0; --ci) {
        const int64_t t0 = ci * C;
        for (int64_t h = 0; h < H; ++h) {
            const float* S0 = ckpt + (ci * H + h) * K * V;
            std::copy(S0, S0 + K * V, b.S.begin());
            ChunkView c = chunk_view(p, h, t0, C);
            c.S = b.S.data();
            const int64_t rk = (t0 * H + h) * K, rv = (t0 * H + h) * V;
            recompute(c, C, s, b);
            products(c, C, d.dO + rv, &dS[h * K * V], s, b, d.dv + rv, d.dbeta + t0 * H + h);
            score_grads(c, C, s, b);
            assemble(c, s, b, d.dq + rk, d.dk + rk, d.dg + rk);
            std::copy(b.dS.begin(), b.dS.end(), dS.begin() + h * K * V);
        }
    }
}

}  // namespace hymoe::ops
