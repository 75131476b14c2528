// The AVX-512-BF16 GEMM for products with bf16 weights and many rows (backend/cpu/weight_kernels.h;
// the few-row GEMVs are gemv_avx512.cpp's). Compiled with -mavx512f -mavx512bw -mavx512vl
// -mavx512bf16; weight_gemm.cpp calls it only after cpu_has_avx512_bf16(). fp32 accumulation.
// Loops over the register tile carry `#pragma GCC unroll` so that -O2 keeps the accumulators in
// registers. g++ 12's AVX-512 headers start vectors as `__Y = __Y` (undefined on purpose), which
// -Wuninitialized reports at every inlined use: silenced for this file only.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <algorithm>
#include <immintrin.h>
#include <vector>

#include "avx512_transpose.h"
#include "hymoe/core/types.h"
#include "weight_kernels.h"

namespace hymoe::ops::detail {

bool cpu_has_avx512_bf16() {
    __builtin_cpu_init();
    return cpu_has_avx512() && __builtin_cpu_supports("avx512bf16");
}

namespace {

// ---- GEMM: many rows, VDPBF16PS on packed panels -------------------------------------------

constexpr int64_t kNr = 64;  // panel columns: four 16-lane vectors
constexpr int kMr = 6;       // tile rows: 6 × 4 accumulators
constexpr int64_t kKc = 64;  // K block, in bf16 pairs: a 64 × 64 panel block is 16 KiB
constexpr int64_t kMinParallelFlops = int64_t{1} << 22;  // smaller products stay on one thread

// panel [kp, 64] of bf16 pairs: panel[p][j] = (w[j][2p], w[j][2p+1]) for the panel's `cols`
// weight rows j (zero beyond them and beyond k). Even k: a row is kp 32-bit pairs, moved in 16 × 16
// blocks through registers (as bits); odd k (rare) element by element.
void pack_panel(const uint16_t* w, int64_t ldw, int64_t cols, int64_t k, uint32_t* panel) {
    const int64_t kp = (k + 1) / 2;
    if (k % 2 != 0) {
        std::fill_n(panel, kp * kNr, 0u);
        for (int64_t j = 0; j < cols; ++j) {
            const uint16_t* row = w + j * ldw;
            for (int64_t p = 0; p < k / 2; ++p)
                panel[p * kNr + j] = uint32_t{row[2 * p]} | uint32_t{row[2 * p + 1]} << 16;
            panel[(kp - 1) * kNr + j] = row[k - 1];
        }
        return;
    }
    for (int64_t j = 0; j < kNr; j += 16) {
        for (int64_t p = 0; p < kp; p += 16) {
            const int64_t left = std::min<int64_t>(16, kp - p);
            const __mmask16 mk = left == 16 ? 0xffff : static_cast<__mmask16>((1u << left) - 1);
            __m512 r[16];
#pragma GCC unroll 16
            for (int i = 0; i < 16; ++i)
                r[i] = j + i < cols ? _mm512_castsi512_ps(
                                          _mm512_maskz_loadu_epi32(mk, w + (j + i) * ldw + 2 * p))
                                    : _mm512_setzero_ps();
            transpose16(r);
            for (int64_t i = 0; i < left; ++i)
                _mm512_store_si512(panel + (p + i) * kNr + j, _mm512_castps_si512(r[i]));
        }
    }
}

// c [R, cols] (+)= a16 [R, p0:p1] · panel [p0:p1]: R rows of bf16-pair activations against one
// K block of a panel; the first block applies beta to C, later ones add to it.
template <int R>
void gemm_tile(int64_t p0,
               int64_t p1,
               const uint32_t* a16,
               int64_t kp,
               const uint32_t* panel,
               float alpha,
               float beta,
               bool first,
               float* c,
               int64_t ldc,
               int64_t cols) {
    __m512 acc[R][4];
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i)
#pragma GCC unroll 8
        for (int v = 0; v < 4; ++v)
            acc[i][v] = _mm512_setzero_ps();
    for (int64_t p = p0; p < p1; ++p) {
        const uint32_t* bp = panel + p * kNr;
        __m512bh b[4];
#pragma GCC unroll 8
        for (int v = 0; v < 4; ++v)
            b[v] = reinterpret_cast<__m512bh>(_mm512_load_si512(bp + 16 * v));
#pragma GCC unroll 8
        for (int i = 0; i < R; ++i) {
            const __m512bh ai =
                reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(a16[i * kp + p])));
#pragma GCC unroll 8
            for (int v = 0; v < 4; ++v)
                acc[i][v] = _mm512_dpbf16_ps(acc[i][v], ai, b[v]);
        }
    }
    const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(first ? beta : 1.0f);
    const bool read_c = !first || beta != 0.0f;
#pragma GCC unroll 8
    for (int v = 0; v < 4; ++v) {
        const int64_t left = cols - 16 * v;
        if (left <= 0)
            break;
        const __mmask16 mk = left >= 16 ? 0xffff : static_cast<__mmask16>((1u << left) - 1);
#pragma GCC unroll 8
        for (int i = 0; i < R; ++i) {
            float* ci = c + i * ldc + 16 * v;
            __m512 out = _mm512_mul_ps(va, acc[i][v]);
            if (read_c)
                out = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(mk, ci), out);
            _mm512_mask_storeu_ps(ci, mk, out);
        }
    }
}

using TileFn = void (*)(int64_t,
                        int64_t,
                        const uint32_t*,
                        int64_t,
                        const uint32_t*,
                        float,
                        float,
                        bool,
                        float*,
                        int64_t,
                        int64_t);
constexpr TileFn kTiles[kMr + 1] = {
    nullptr, gemm_tile<1>, gemm_tile<2>, gemm_tile<3>, gemm_tile<4>, gemm_tile<5>, gemm_tile<6>};

}  // namespace

void bf16_gemm_avx512(int64_t m,
                      int64_t n,
                      int64_t k,
                      float alpha,
                      const float* a,
                      int64_t lda,
                      const uint16_t* w,
                      int64_t ldw,
                      float beta,
                      float* c,
                      int64_t ldc) {
    const int64_t kp = (k + 1) / 2;
    std::vector<uint32_t> a16(static_cast<size_t>(m * kp), 0u);  // [m, kp] bf16 pairs of a
    auto* a16h = reinterpret_cast<uint16_t*>(a16.data());
    for (int64_t i = 0; i < m; ++i)
        round_to_bf16(a + i * lda, k, a16h + i * 2 * kp);
    struct alignas(64) Line {
        uint32_t v[16];
    };
    const int64_t n_panels = (n + kNr - 1) / kNr;
    // panels over the threads (OpenMP, when built with it): each packs its own, and a panel's
    // columns of C are computed as on one thread
#pragma omp parallel if (n_panels > 1 && m * n * k >= kMinParallelFlops)
    {
        std::vector<Line> panel(static_cast<size_t>(kp * kNr / 16));  // [kp, 64] 64-byte aligned
#pragma omp for schedule(static)
        for (int64_t jp = 0; jp < n_panels; ++jp) {
            const int64_t j = jp * kNr, cols = std::min(kNr, n - j);
            pack_panel(w + j * ldw, ldw, cols, k, panel.data()->v);
            // K blocks of kKc pairs: the panel's block (16 KiB) stays in L1 across the row tiles
            for (int64_t p0 = 0; p0 < kp || p0 == 0; p0 += kKc) {
                const int64_t p1 = std::min(kp, p0 + kKc);
                for (int64_t i = 0; i < m; i += kMr) {
                    const int64_t rows = std::min<int64_t>(kMr, m - i);
                    kTiles[rows](p0,
                                 p1,
                                 a16.data() + i * kp,
                                 kp,
                                 panel.data()->v,
                                 alpha,
                                 beta,
                                 p0 == 0,
                                 c + i * ldc + j,
                                 ldc,
                                 cols);
                }
            }
        }
    }
}

}  // namespace hymoe::ops::detail
