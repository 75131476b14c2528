// The two evaluations of the KDA recurrence (spec/model-math.md §3) on one sequence, every head,
// in fp32: the token-by-token scan (fla naive_recurrent_kda's arithmetic, each token of a head in
// two sweeps of its state: kda_simd.h kda_token_step) and the chunked WY form (fla
// naive_chunk_kda). Both continue from the state given and leave the state after the last token.
// Chunked form, per head and chunk of L tokens with state S [K, V] from the previous chunk and
// Γ_c = Σ_{j≤c} g_j the within-chunk cumulative log-decay [L, K]:
//   M[c,i] = β_c Σ_κ k_cκ k_iκ e^{Γ_cκ − Γ_iκ} (i < c),   T = (I + M)^{-1} Diag(β),
//   W = T (K ⊙ e^Γ),  U = T V,  V' = U − W S = T (V − (K ⊙ e^Γ) S),
//   O = (Q ⊙ e^Γ) S + [Aqk]_{j≤c} V',   Aqk[c,j] = Σ_κ q_cκ k_jκ e^{Γ_cκ − Γ_jκ},
//   S ← e^{Γ_L} ⊙ S + (K ⊙ e^{Γ_L − Γ})ᵀ V'.
// Since g ≤ 0, every decay factor used here (e^{Γ_c − Γ_j} with j ≤ c, e^{Γ_c}, e^{Γ_L − Γ_c}) is
// ≤ 1: the masked upper triangle, whose factors are above 1 and overflow under strong decay, is
// never computed (its entries are set to zero). Each factor is the running product of the tokens'
// own e^g between the two rows (kda_simd.h), as the recurrence applies them to its state, not the
// exponential of a difference of cumulative sums, whose rounding grows with |Γ| (at g down to −300
// that rounding put 6e-5 between the two forms; the products, 6e-8). The work is GEMMs (ops::gemm)
// per chunk and head but for the 16 × 16 diagonal blocks: M and Aqk by sub-chunks of 16 rows, the
// diagonal block with pairwise factors (kda_simd.h), the block row left of it as a product of
// factors taken about the sub-chunk's first row r (e^{Γ_c − Γ_r}, e^{Γ_r − Γ_j}: both ≤ 1 as
// well); the inverse by blocked forward substitution; W, U, V', O and the state update as
// products.
#include <algorithm>
#include <cmath>
#include <vector>

#include "../kda_scan_args.h"
#include "hymoe/backend/ops.h"
#include "hymoe/core/error.h"
#include "kda_chunk.h"
#include "kda_simd.h"

namespace hymoe::ops {

namespace {

// c [L, n] = a b + beta c for a [L, L] lower triangular (zero above the diagonal): the first
// half of the rows against the first half of b's rows only, the rest against all of b.
void lower_gemm(int64_t L,
                int64_t n,
                const float* a,  // [L, L] stride lda
                int64_t lda,
                const float* b,  // [L, n] stride ldb
                int64_t ldb,
                float beta,
                float* c,  // [L, n] stride ldc
                int64_t ldc) {
    const int64_t h = L / 2;
    ops::gemm(false, false, h, n, h, 1.0f, a, lda, b, ldb, beta, c, ldc);
    ops::gemm(false, false, L - h, n, L, 1.0f, a + h * lda, lda, b, ldb, beta, c + h * ldc, ldc);
}

}  // namespace

// The pieces of one chunk of one head (their contracts are in kda_chunk.h).
namespace kda_chunk {

// e^g, Γ, Q ⊙ e^Γ, K ⊙ e^Γ, e^{Γ_L}: the decays as running products of e^g.
void chunk_decays(const ChunkView& c, ChunkScratch& s) {
    const int64_t L = c.L, K = c.K;
    kda_gates(c.g, c.ldk, L, K, s.eg.data(), s.gam.data());
    s.qg = s.qkg.data();
    s.kg = s.qg + L * K;
    kda_decay_forward(c.q, c.k, c.ldk, s.eg.data(), true, L, K, s.qg, s.kg, s.e.data());
}

void chunk_scores(const ChunkView& c, int64_t C, ChunkScratch& s) {
    const int64_t L = c.L, K = c.K;
    for (int64_t i = 0; i < L; ++i) {
        std::fill(&s.m[i * C], &s.m[i * C + L], 0.0f);
        std::fill(&s.aqk[i * C], &s.aqk[i * C + L], 0.0f);
    }
    for (int64_t r = 0; r < L; r += sub) {
        const int64_t n = std::min(sub, L - r);
        kda_diag_scores(n,
                        K,
                        c.q + r * c.ldk,
                        c.k + r * c.ldk,
                        c.ldk,
                        &s.eg[r * K],
                        &s.aqk[r * C + r],
                        &s.m[r * C + r],
                        C);
        if (r == 0)
            continue;
        float* qs = s.qks.data();  // [n, K], then ks [n, K]: one product with the rows before r
        kda_decay_forward(c.q + r * c.ldk,
                          c.k + r * c.ldk,
                          c.ldk,
                          &s.eg[r * K],
                          false,
                          n,
                          K,
                          qs,
                          qs + n * K,
                          nullptr);
        kda_decay_backward(c.k, c.ldk, s.eg.data(), true, r, K, s.kt.data());
        ops::gemm(false, true, 2 * n, r, K, 1.0f, qs, K, s.kt.data(), K, 0.0f, s.blk.data(), C);
        for (int64_t i = 0; i < n; ++i) {
            std::copy_n(&s.blk[i * C], r, &s.aqk[(r + i) * C]);
            std::copy_n(&s.blk[(n + i) * C], r, &s.m[(r + i) * C]);
        }
    }
    for (int64_t i = 0; i < L; ++i)
        s.m[i * C + i] = 0.0f;
}

void chunk_beta_rows(const ChunkView& c, int64_t C, ChunkScratch& s) {
    kda_scale(s.m.data(), C, c.beta, c.H, nullptr, c.L, c.L);  // zero on and above the diagonal
}

void chunk_inverse(const ChunkView& c, int64_t C, ChunkScratch& s) {
    const int64_t L = c.L;
    for (int64_t i = 0; i < L; ++i)
        std::fill(&s.t[i * C], &s.t[i * C + L], 0.0f);
    for (int64_t r = 0; r < L; r += sub) {
        const int64_t n = std::min(sub, L - r);
        for (int64_t i = r; i < r + n; ++i) {
            for (int64_t j = r; j < i; ++j) {
                float v = -s.m[i * C + j];
                for (int64_t l = j + 1; l < i; ++l)
                    v -= s.m[i * C + l] * s.t[l * C + j];
                s.t[i * C + j] = v;
            }
            s.t[i * C + i] = 1.0f;
        }
        if (r == 0)
            continue;
        ops::gemm(false, false, n, r, r, 1.0f, &s.m[r * C], C, s.t.data(), C, 0.0f, s.x.data(), C);
        ops::gemm(
            false, false, n, r, n, -1.0f, &s.t[r * C + r], C, s.x.data(), C, 0.0f, &s.t[r * C], C);
    }
}

void chunk_beta_columns(const ChunkView& c, int64_t C, ChunkScratch& s) {
    for (int64_t j = 0; j < c.L; ++j)
        s.b[j] = c.beta[j * c.H];
    kda_scale(s.t.data(), C, nullptr, 0, s.b.data(), c.L, c.L);  // zero above the diagonal
}

void chunk_vprime(const ChunkView& c, int64_t C, ChunkScratch& s, bool with_q) {
    const int64_t L = c.L, K = c.K, V = c.V;
    float* ks = s.xs.data() + (with_q ? L * V : 0);  // [L, V] K_g S, then V − K_g S
    ops::gemm(false,
              false,
              with_q ? 2 * L : L,
              V,
              K,
              1.0f,
              with_q ? s.qg : s.kg,
              K,
              c.S,
              V,
              0.0f,
              s.xs.data(),
              V);
    kda_sub_from(c.v, c.ldv, ks, V, L, V);
    lower_gemm(L, V, s.t.data(), C, ks, V, 0.0f, s.u.data(), V);
}

ChunkView chunk_view(const KdaScanParams& p, int64_t h, int64_t t0, int64_t C) {
    const int64_t H = p.n_head, K = p.d_k, V = p.d_v;
    return ChunkView{std::min(C, p.n_tok - t0),
                     K,
                     V,
                     H,
                     H * K,
                     H * V,
                     p.q + (t0 * H + h) * K,
                     p.k + (t0 * H + h) * K,
                     p.v + (t0 * H + h) * V,
                     p.g + (t0 * H + h) * K,
                     p.beta + t0 * H + h,
                     p.o ? p.o + (t0 * H + h) * V : nullptr,
                     p.S ? p.S + h * K * V : nullptr};
}

}  // namespace kda_chunk

namespace {

using namespace kda_chunk;

// One chunk of one head: O for its tokens, and the state carried past it.
void chunk_step(const ChunkView& c, int64_t C, ChunkScratch& s) {
    const int64_t L = c.L, K = c.K, V = c.V;
    chunk_decays(c, s);
    chunk_scores(c, C, s);
    chunk_beta_rows(c, C, s);
    chunk_inverse(c, C, s);
    chunk_beta_columns(c, C, s);
    chunk_vprime(c, C, s, true);
    for (int64_t i = 0; i < L; ++i)  // O = Q_g S + Aqk V'
        std::copy_n(&s.xs[i * V], V, c.o + i * c.ldv);
    lower_gemm(L, V, s.aqk.data(), C, s.u.data(), V, 1.0f, c.o, c.ldv);
    kda_scale(c.S, V, s.e.data(), 1, nullptr, K, V);                      // e^{Γ_L} ⊙ S
    kda_decay_backward_t(c.k, c.ldk, s.eg.data(), L, K, s.kl.data(), C);  // (K ⊙ e^{Γ_L − Γ})ᵀ
    ops::gemm(false, false, K, V, L, 1.0f, s.kl.data(), C, s.u.data(), V, 1.0f, c.S, V);
}

}  // namespace

void kda_recurrent(const KdaScanParams& p) {
    detail::kda_scan_check("kda_recurrent", p);
    const int64_t H = p.n_head, K = p.d_k, V = p.d_v;
    std::vector<float> work(K + V);  // kda_token_step's scratch
    // tokens outer: a token's rows of every head lie together, read once in order (heads outer
    // read each row H times in pieces: 0.8x at 2048 tokens, H 8, K = V = 128), and the H states
    // stay in L2 (512 KiB there)
    for (int64_t t = 0; t < p.n_tok; ++t) {
        for (int64_t h = 0; h < H; ++h) {
            float* S = p.S + h * K * V;  // [K, V]
            kda_token_step(K,
                           V,
                           p.q + (t * H + h) * K,
                           p.k + (t * H + h) * K,
                           p.v + (t * H + h) * V,
                           p.g + (t * H + h) * K,
                           p.beta[t * H + h],
                           S,
                           p.o + (t * H + h) * V,
                           work.data());
        }
    }
}

void kda_chunked(const KdaScanParams& p, int chunk) {
    detail::kda_scan_check("kda_chunked", p);
    HYMOE_CHECK(chunk > 0, "kda_chunked: chunk ", chunk);
    const int64_t H = p.n_head, C = chunk;
    ChunkScratch scratch(C, p.d_k, p.d_v);
    for (int64_t t0 = 0; t0 < p.n_tok; t0 += C)  // a chunk's rows of every head lie together
        for (int64_t h = 0; h < H; ++h)
            chunk_step(chunk_view(p, h, t0, C), C, scratch);
}

}  // namespace hymoe::ops
