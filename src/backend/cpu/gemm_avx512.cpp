// The fp32 AVX-512 GEMM (backend/cpu/gemm_f32.h): op(B) packed per K block of 256 in panels of
// 64 columns ([256][64], 64-byte aligned: 64 KiB that the row tiles reuse from L1/L2), op(A) read
// in place when A is [m, k] (packed in tiles of 6 rows, [256][6], when transposed), and a 6 × 64
// register tile (24 zmm accumulators, 4 panel vectors, one broadcast). The next tile's lines of C
// are prefetched: C rows lie ldc apart and C is read again for each K block (measured: 1.1× →
// 1.8× OpenBLAS's AVX2 sgemm at 2048³, docs/guide/performance.md). Compiled with -mavx512f
// -mavx512bw -mavx512vl (and -fopenmp); callers check cpu_has_avx512() first. Loops over the
// register tile carry `#pragma GCC unroll` so that -O2 keeps the accumulators in registers. g++
// 12's AVX-512 headers start vectors as `__Y = __Y` (undefined on purpose), which -Wuninitialized
// reports at every inlined use: silenced for this file only.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <algorithm>
#include <immintrin.h>
#include <vector>

#include "avx512_transpose.h"
#include "gemm_f32.h"

namespace hymoe::ops::detail {

namespace {

constexpr int64_t kNr = 64;   // panel columns: four 16-lane vectors
constexpr int64_t kMr = 6;    // tile rows: 6 × 4 accumulators
constexpr int64_t kKc = 256;  // K block: a 256 × 64 panel block is 64 KiB
constexpr int64_t kMinParallelFlops = int64_t{1} << 22;  // smaller products stay on one thread

struct alignas(64) Line {
    float v[16];
};

// A buffer of at least `floats` floats, 64-byte aligned, kept per thread across calls (no page
// faults on every product).
float* scratch(std::vector<Line>& buf, int64_t floats) {
    const auto lines = static_cast<size_t>((floats + 15) / 16);
    if (buf.size() < lines)
        buf.resize(lines);
    return buf.data()->v;
}

// dst [kb][6] = A [p0 : p0+kb, i0 : i0+rows] (A [k, m], trans_a; zero beyond `rows`): the
// rows of op(A) read 6 floats apart, as the tile reads them.
void pack_at(
    const float* a, int64_t lda, int64_t i0, int64_t rows, int64_t p0, int64_t kb, float* dst) {
    for (int64_t p = 0; p < kb; ++p) {
        const float* src = a + (p0 + p) * lda + i0;
        for (int64_t i = 0; i < kMr; ++i)
            dst[p * kMr + i] = i < rows ? src[i] : 0.0f;
    }
}

// panel [kb][64] = op(B) [p0 : p0+kb, j0 : j0+cols] (zero beyond `cols`).
void pack_b(bool trans_b,
            const float* b,
            int64_t ldb,
            int64_t j0,
            int64_t cols,
            int64_t p0,
            int64_t kb,
            float* panel) {
    if (!trans_b) {  // B [k, n]: a row of the panel is a contiguous run of B's row p
        for (int64_t p = 0; p < kb; ++p) {
            std::copy_n(b + (p0 + p) * ldb + j0, cols, panel + p * kNr);
            std::fill(panel + p * kNr + cols, panel + (p + 1) * kNr, 0.0f);
        }
        return;
    }
    // B [n, k]: 16 × 16 blocks (16 rows of B, 16 of k) transposed through registers; rows beyond
    // `cols` and k beyond kb read as zero (masked loads), rows of the panel beyond kb not written
    for (int64_t j = 0; j < kNr; j += 16) {
        for (int64_t p = 0; p < kb; p += 16) {
            const int64_t left = std::min<int64_t>(16, kb - p);
            const __mmask16 mk = left == 16 ? 0xffff : static_cast<__mmask16>((1u << left) - 1);
            __m512 r[16];
#pragma GCC unroll 16
            for (int i = 0; i < 16; ++i)
                r[i] = j + i < cols ? _mm512_maskz_loadu_ps(mk, b + (j0 + j + i) * ldb + p0 + p)
                                    : _mm512_setzero_ps();
            transpose16(r);
            for (int64_t i = 0; i < left; ++i)
                _mm512_store_ps(panel + (p + i) * kNr + j, r[i]);
        }
    }
}

// c [R, cols] (+)= alpha · a [R, kb] · bp [kb][64] (first 16·V columns), element (i, p) of a at
// a[i·rs + p·cs] (rs = lda, cs = 1 in place; rs = 1, cs = 6 packed): one K block of one panel;
// the first block applies beta to C (beta = 0: C not read), later ones add to it.
template <int R, int V>
void tile(int64_t kb,
          const float* ap,
          int64_t rs,
          int64_t cs,
          const float* bp,
          float alpha,
          float beta,
          bool first,
          float* c,
          int64_t ldc,
          int64_t cols) {
    __m512 acc[R][V];
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i)
#pragma GCC unroll 8
        for (int v = 0; v < V; ++v)
            acc[i][v] = _mm512_setzero_ps();
    for (int64_t p = 0; p < kb; ++p) {
        __m512 b[V];
#pragma GCC unroll 8
        for (int v = 0; v < V; ++v)
            b[v] = _mm512_load_ps(bp + p * kNr + 16 * v);
#pragma GCC unroll 8
        for (int i = 0; i < R; ++i) {
            const __m512 ai = _mm512_set1_ps(ap[i * rs + p * cs]);
#pragma GCC unroll 8
            for (int v = 0; v < V; ++v)
                acc[i][v] = _mm512_fmadd_ps(ai, b[v], acc[i][v]);
        }
    }
    const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(first ? beta : 1.0f);
    const bool read_c = !first || beta != 0.0f;
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) {
        const int64_t left = cols - 16 * v;
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
                        const float*,
                        int64_t,
                        int64_t,
                        const float*,
                        float,
                        float,
                        bool,
                        float*,
                        int64_t,
                        int64_t);

template <int R>
constexpr TileFn kRow[5] = {nullptr, tile<R, 1>, tile<R, 2>, tile<R, 3>, tile<R, 4>};
constexpr const TileFn* kTiles[kMr + 1] = {
    nullptr, kRow<1>, kRow<2>, kRow<3>, kRow<4>, kRow<5>, kRow<6>};

// The lines of c [rows, cols] into L1 ahead of the tile that reads them: C rows lie ldc apart, a
// stride the hardware prefetchers do not follow, and C is read again for every K block.
void prefetch_c(const float* c, int64_t ldc, int64_t rows, int64_t cols) {
    for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; j += 16)
            _mm_prefetch(reinterpret_cast<const char*>(c + i * ldc + j), _MM_HINT_T0);
}

// c [m, n] = beta · c (beta = 0: zeros, C not read): the product of an empty K.
void scale_c(int64_t m, int64_t n, float beta, float* c, int64_t ldc) {
    for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j)
            c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
}

}  // namespace

namespace {

struct Product {
    bool trans_a, trans_b;
    int64_t m, n, k;
    float alpha;
    const float* a;
    int64_t lda;
    const float* b;
    int64_t ldb;
    float beta;
    float* c;
    int64_t ldc;
};

// The product on the calling thread, or on each thread of an enclosing parallel region (the loops
// over tiles and panels are orphaned `omp for`s); ap: a packing buffer for a K block of op(A)
// when trans_a, shared by the threads.
void run(const Product& g, float* ap) {
    thread_local std::vector<Line> b_buf;
    float* panel = scratch(b_buf, kKc * kNr);  // [kb][64]
    const int64_t n_panels = (g.n + kNr - 1) / kNr, n_tiles = (g.m + kMr - 1) / kMr;
    for (int64_t p0 = 0; p0 < g.k; p0 += kKc) {
        const int64_t kb = std::min(kKc, g.k - p0);
        if (g.trans_a) {
#pragma omp for schedule(static)
            for (int64_t t = 0; t < n_tiles; ++t)
                pack_at(
                    g.a, g.lda, t * kMr, std::min(kMr, g.m - t * kMr), p0, kb, ap + t * kMr * kb);
        }
        // panels over the threads: a panel's columns of C are computed as on one thread
#pragma omp for schedule(static)
        for (int64_t jp = 0; jp < n_panels; ++jp) {
            const int64_t j = jp * kNr, cols = std::min(kNr, g.n - j);
            pack_b(g.trans_b, g.b, g.ldb, j, cols, p0, kb, panel);
            for (int64_t i = 0; i < g.m; i += kMr) {
                if (i + kMr < g.m)
                    prefetch_c(
                        g.c + (i + kMr) * g.ldc + j, g.ldc, std::min(kMr, g.m - i - kMr), cols);
                kTiles[std::min(kMr, g.m - i)][(cols + 15) / 16](
                    kb,
                    g.trans_a ? ap + i * kb : g.a + i * g.lda + p0,
                    g.trans_a ? 1 : g.lda,
                    g.trans_a ? kMr : 1,
                    panel,
                    g.alpha,
                    g.beta,
                    p0 == 0,
                    g.c + i * g.ldc + j,
                    g.ldc,
                    cols);
            }
        }
    }
}

}  // namespace

void f32_gemm_avx512(bool trans_a,
                     bool trans_b,
                     int64_t m,
                     int64_t n,
                     int64_t k,
                     float alpha,
                     const float* a,
                     int64_t lda,
                     const float* b,
                     int64_t ldb,
                     float beta,
                     float* c,
                     int64_t ldc) {
    if (m == 0 || n == 0)
        return;
    if (k == 0)
        return scale_c(m, n, beta, c, ldc);
    const Product g{trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc};
    // op(A) is read in place when A is [m, k]; when trans_a, a K block of it is packed in tiles
    thread_local std::vector<Line> a_buf;
    float* ap = trans_a ? scratch(a_buf, (m + kMr - 1) / kMr * kMr * std::min(k, kKc)) : nullptr;
    if (n <= kNr || m * n * k < kMinParallelFlops)
        return run(g, ap);
#pragma omp parallel
    run(g, ap);
}

}  // namespace hymoe::ops::detail
