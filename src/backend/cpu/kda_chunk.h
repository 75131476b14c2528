// The pieces of the chunked KDA form (spec/model-math.md §3) for one chunk of one head, shared by
// the chunked forward (kda_scan.cpp) and the chunked backward (kda_chunk_backward.cpp), which
// recomputes a chunk's intra-chunk matrices with exactly the forward's code. Private to
// backend/cpu. Notation (kda_scan.cpp): Γ the within-chunk cumulative log-decay [L, K], A_kk[c, i]
// = Σ_κ k_cκ k_iκ e^{Γ_cκ − Γ_iκ} (i < c), M = Diag(β) A_kk, N = (I + M)^{-1}, T = N Diag(β),
// W = T (K ⊙ e^Γ), U = T V, V' = U − W S, Aqk[c, j] = Σ_κ q_cκ k_jκ e^{Γ_cκ − Γ_jκ} (j ≤ c).
#pragma once

#include <cstdint>
#include <vector>

#include "hymoe/backend/kda_params.h"

namespace hymoe::ops::kda_chunk {

constexpr int64_t sub = 16;  // sub-chunk: the diagonal blocks of A and of the WY inverse

// Scratch for one chunk of one head, sized for chunks of up to C tokens (row strides K, V, C).
struct ChunkScratch {
    std::vector<float> eg;   // [C, K] e^g
    std::vector<float> gam;  // [C, K] Γ
    std::vector<float> e;    // [K] e^{Γ_L}
    std::vector<float> qkg;  // [2C, K]: Q ⊙ e^Γ in rows [0, L), K ⊙ e^Γ in rows [L, 2L)
    float* qg = nullptr;     // [L, K] Q ⊙ e^Γ, in qkg (set by chunk_decays)
    float* kg = nullptr;     // [L, K] K ⊙ e^Γ, in qkg right after qg
    std::vector<float> kl;   // K ⊙ e^{Γ_L − Γ}: [C, K] in the backward, [K, C] in the forward
    std::vector<float> qks;  // [2 sub, K] a sub-chunk's Q ⊙ e^{Γ − Γ_r}, then its K ⊙ e^{Γ − Γ_r}
    std::vector<float> blk;  // [2 sub, C] their products with the rows before it
    std::vector<float> kt;   // [C, K] the rows before it, K ⊙ e^{Γ_r − Γ}
    std::vector<float> m;    // [C, C] M, strictly lower
    std::vector<float> aqk;  // [C, C] Aqk, lower with the diagonal
    std::vector<float> t;    // [C, C] T, lower with the diagonal
    std::vector<float> b;    // [C] β of the chunk's rows
    std::vector<float> x;    // [sub, C] M[I, <I] · N[<I, <I]
    std::vector<float> xs;   // [2C, V] Q_g S then K_g S (rows as in qkg), then V − K_g S
    std::vector<float> w;    // [C, K] W (the backward's)
    std::vector<float> u;    // [C, V] V'
    ChunkScratch(int64_t C, int64_t K, int64_t V)
        : eg(C * K),
          gam(C * K),
          e(K),
          qkg(2 * C * K),
          kl(C * K),
          qks(2 * sub * K),
          blk(2 * sub * C),
          kt(C * K),
          m(C * C),
          aqk(C * C),
          t(C * C),
          b(C),
          x(sub * C),
          xs(2 * C * V),
          w(C * K),
          u(C * V) {}
    ChunkScratch(const ChunkScratch&) = delete;  // qg, kg point into qkg
    ChunkScratch& operator=(const ChunkScratch&) = delete;
};

// One head's rows of one chunk: row c of q, k, g at c·ldk, of v, o at c·ldv, β at c·H.
struct ChunkView {
    int64_t L, K, V, H, ldk, ldv;
    const float* q;     // [L, K] (stride ldk)
    const float* k;     // [L, K] (stride ldk)
    const float* v;     // [L, V] (stride ldv)
    const float* g;     // [L, K] (stride ldk)
    const float* beta;  // [L] (stride H)
    float* o;           // [L, V] (stride ldv)
    float* S;           // [K, V] this head's state
};

// The chunk of L = min(C, T − t0) tokens of head h starting at token t0 (o and S null when p's
// are).
ChunkView chunk_view(const KdaScanParams& p, int64_t h, int64_t t0, int64_t C);

// s.eg = e^g, s.gam = Γ, s.qg = Q ⊙ e^Γ, s.kg = K ⊙ e^Γ, s.e = e^{Γ_L}, every factor e^{Γ_c −
// Γ_j} the running product of the e^g between (kda_simd.h).
void chunk_decays(const ChunkView& c, ChunkScratch& s);
// s.aqk = Aqk (lower with the diagonal) and s.m = A_kk (strictly lower), zero above, by
// sub-chunks I of `sub` rows starting at r: the diagonal block with pairwise factors
// (kda_diag_scores), the block row left of it as two GEMMs of factors taken about the reference
// Γ_r, (Q_I ⊙ e^{Γ_I − Γ_r})(K_{<r} ⊙ e^{Γ_r − Γ_{<r}})ᵀ and the same with K_I, all ≤ 1 (Γ
// falls down the rows), running products of s.eg. Needs chunk_decays.
void chunk_scores(const ChunkView& c, int64_t C, ChunkScratch& s);
// s.m ← M = Diag(β) A_kk.
void chunk_beta_rows(const ChunkView& c, int64_t C, ChunkScratch& s);
// s.t = N = (I + M)^{-1}, unit lower triangular, by block rows of `sub`: the diagonal block
// N_II = (I + M_II)^{-1} by forward substitution, the blocks left of it N_{I,<I} =
// −N_II (M_{I,<I} N_{<I,<I}) as two GEMMs.
void chunk_inverse(const ChunkView& c, int64_t C, ChunkScratch& s);
// s.t ← T = N Diag(β).
void chunk_beta_columns(const ChunkView& c, int64_t C, ChunkScratch& s);
// s.u = V' = T (V − K_g S), from the state c.S before the chunk (= U − W S with U = T V, W =
// T K_g, without forming W), by one product of S with the rows of K_g, and of Q_g before them when
// with_q (s.xs rows [0, L) = Q_g S, for O). Needs T in s.t.
void chunk_vprime(const ChunkView& c, int64_t C, ChunkScratch& s, bool with_q);

}  // namespace hymoe::ops::kda_chunk
