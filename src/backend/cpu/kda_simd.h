// The vector kernels of the KDA scans (kda_scan.cpp, kda_chunk_backward.cpp): a fast e^x for the
// non-positive exponents the chunked form evaluates, the decay factors and diagonal sub-block
// scores of the chunked forward as running products of e^g, the pairwise-exponential backward of
// those scores, and the one-token step of the recurrence. Each has an AVX-512 body,
// chosen at run time when the CPU has avx512f, and a portable scalar one with the same polynomial.
// kda_exp: Cody-Waite range reduction x = n·ln2 + r, |r| ≤ ln2/2, and the degree-7 expansion e^r ≈
// 1 + r + r²·P5(r) (Cephes expf coefficients), scaled by 2^n. Max relative error against the exact
// e^x: 2e-7 over x ∈ [−87.3, 0] (normal results; tests/unit/backend/test_kda_simd.cpp measures it);
// below, the result underflows gracefully (subnormal, then 0 from x < −104).
#pragma once

#include <cstdint>

namespace hymoe::ops {

// y[i] = e^{x[i]} for x[i] ≤ 0 (y may alias x).
void kda_exp(const float* x, float* y, int64_t n);

// out[i, x] = a[i, x] · e^{sign·(γ[i, x] − ref[x])} for `rows` rows of K, ref null meaning 0;
// the caller keeps every exponent ≤ 0 (sign −1 with ref at or below γ, sign +1 with ref above).
void kda_decay_rows(const float* a,  // [rows, K] stride lda
                    int64_t lda,
                    const float* gam,  // [rows, K] stride K
                    const float* ref,  // [K] or null
                    float sign,        // +1 or −1
                    int64_t rows,
                    int64_t K,
                    float* out);  // [rows, K] stride K

// The decay kernels of the chunked forward (kda_simd_decay.cpp), every factor e^{Γ_c − Γ_j} (j ≤ c)
// as the running product Π_{l=j+1..c} e^{g_l} of the tokens' own e^g, the factors the recurrence
// applies to its state one token at a time: no exponential of a cumulative sum (whose rounding
// grows with |Γ|), nothing above 1, so nothing overflows however strong the decay.

// eg[i] = e^{g[i]} (kda_exp's polynomial) and gam[i] = Σ_{l≤i} g[l], for `rows` rows of K.
void kda_gates(const float* g,  // [rows, K] stride ldg, log-decay ≤ 0
               int64_t ldg,
               int64_t rows,
               int64_t K,
               float* eg,    // [rows, K] stride K
               float* gam);  // [rows, K] stride K

// a_out[i] = a[i] ⊙ P_i (and b_out[i] = b[i] ⊙ P_i where b is not null) with the running product
// P_i = Π_{l=0..i} eg[l] when `first`, Π_{l=1..i} eg[l] when not (P_0 = 1); last (if not null)
// = P_{rows−1}.
void kda_decay_forward(const float* a,  // [rows, K] stride lda
                       const float* b,  // [rows, K] stride lda, or null
                       int64_t lda,
                       const float* eg,  // [rows, K] stride K
                       bool first,
                       int64_t rows,
                       int64_t K,
                       float* a_out,  // [rows, K] stride K
                       float* b_out,  // [rows, K] stride K
                       float* last);  // [K] or null

// out[i] = a[i] ⊙ Π_{l=i+1..rows} eg[l] when `tail` (eg has rows + 1 rows), Π_{l=i+1..rows−1}
// eg[l] when not.
void kda_decay_backward(const float* a,  // [rows, K] stride lda
                        int64_t lda,
                        const float* eg,  // [rows (+1 when tail), K] stride K
                        bool tail,
                        int64_t rows,
                        int64_t K,
                        float* out);  // [rows, K] stride K

// kda_decay_backward without tail, written transposed: out_t[x, i] = a[i, x] · Π_{l=i+1..rows−1}
// eg[l, x].
void kda_decay_backward_t(const float* a,  // [rows, K] stride lda
                          int64_t lda,
                          const float* eg,  // [rows, K] stride K
                          int64_t rows,
                          int64_t K,
                          float* out_t,  // [K, rows] stride ldo
                          int64_t ldo);

// One diagonal sub-block of n ≤ 16 tokens: for every i and j ≤ i, with f_ij = Π_{l=j+1..i} eg_l
// (= e^{γ_i − γ_j}),
//   aqk[i, j] = Σ_κ q_iκ k_jκ f_ijκ,   akk[i, j] = Σ_κ k_iκ k_jκ f_ijκ;
// the entries above the diagonal are not written.
void kda_diag_scores(int64_t n,
                     int64_t K,
                     const float* q,  // [n, K] stride ld
                     const float* k,  // [n, K] stride ld
                     int64_t ld,
                     const float* eg,  // [n, K] stride K: e^g of the block's tokens
                     float* aqk,       // [n, n] stride ldo
                     float* akk,       // [n, n] stride ldo
                     int64_t ldo);

// a[i, j] *= row_s[i·ss] · col_s[j] for `rows` rows of `cols`, either scale null meaning 1 (the
// AVX-512 body multiplies by the row scale first, then by the column scale).
void kda_scale(float* a,  // [rows, cols] stride lda
               int64_t lda,
               const float* row_s,  // [rows] stride ss, or null
               int64_t ss,
               const float* col_s,  // [cols], or null
               int64_t rows,
               int64_t cols);

// x ← a − x for `rows` rows of `cols`.
void kda_sub_from(const float* a,  // [rows, cols] stride lda
                  int64_t lda,
                  float* x,  // [rows, cols] stride ldx
                  int64_t ldx,
                  int64_t rows,
                  int64_t cols);

// The backward of kda_diag_scores' pairs below the diagonal (kda_chunk_backward.cpp): for every
// i and j < i of a diagonal sub-block of n ≤ 16 tokens, with e = e^{γ_i − γ_j} (every exponent
// ≤ 0), a = daqk[i, j], m = dakk[i, j]:
//   dqa[i] += a · k_j ⊙ e,   dkr[i] += m · k_j ⊙ e,   dkc[j] += (a · q_i + m · k_i) ⊙ e.
void kda_diag_grads(int64_t n,
                    int64_t K,
                    const float* q,  // [n, K] stride ld
                    const float* k,  // [n, K] stride ld
                    int64_t ld,
                    const float* gam,   // [n, K] stride K: cumulative log-decay γ
                    const float* daqk,  // [n, n] stride ldd, read below the diagonal
                    const float* dakk,  // [n, n] stride ldd
                    int64_t ldd,
                    float* dqa,   // [n, K] stride K, accumulated
                    float* dkr,   // [n, K] stride K, accumulated
                    float* dkc);  // [n, K] stride K, accumulated

// One token of the recurrence (spec §3) on one head's state S [K, V], in place:
//   S' = e^g ⊙ S,   u = β (v − S'ᵀk),   S ← S' + k uᵀ,   o = Sᵀq,
// in two sweeps of S by blocks of up to 128 columns: the first reads S for S'ᵀk, the second
// writes S' + k uᵀ and sums o from the values it writes. e^g by kda_exp's polynomial; the AVX-512
// body fuses multiply-adds, so it rounds differently from a plain evaluation of the same formula
// (the bound is in tests/unit/backend/test_kda_simd.cpp).
void kda_token_step(int64_t K,
                    int64_t V,
                    const float* q,  // [K]
                    const float* k,  // [K]
                    const float* v,  // [V]
                    const float* g,  // [K] log-decay, ≤ 0
                    float beta,
                    float* S,      // [K, V]
                    float* o,      // [V]
                    float* work);  // [K + V] scratch
// kda_token_step's portable body (what runs on a CPU without avx512f), for the tests to reach on
// any CPU: the same two sweeps, one rounding per operation.
void kda_token_step_portable(int64_t K,
                             int64_t V,
                             const float* q,
                             const float* k,
                             const float* v,
                             const float* g,
                             float beta,
                             float* S,
                             float* o,
                             float* work);

}  // namespace hymoe::ops
