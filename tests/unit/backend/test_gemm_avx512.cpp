// hymoe's fp32 AVX-512 GEMM (backend/cpu/gemm_f32.h) against an fp64 reference and OpenBLAS, on
// odd shapes (m, n, k from 1 to 200, not multiples of the 6-row tiles, 64-column panels, 16-lane
// vectors nor 256-deep K blocks), all four transposes, alpha/beta, padded leading dimensions.
// Bound: each element is k products summed by FMA in order within a K block, the blocks' partial
// sums added to C in order, each scaled by alpha once: about k + 2·(k/256) + 2 roundings of
// magnitude ≤ |alpha|·Σ|a·b| + |beta·c|, so |err| ≤ (k + 4)·2⁻²⁴·(|alpha|·Σ|a·b| + |beta·c|)
// (first order; k ≤ 600 here keeps the second-order term below 1e-4 of it). OpenBLAS obeys the
// same bound, so the two differ by at most twice it. Then the properties the model relies on: a
// row's bits do not depend on the rows around it (batch invariance), 2 threads give the bits of
// 1, beta = 0 never reads C, k = 0 scales C, and ops::gemm's routing (batch-invariant runs take
// every product to this kernel; forcing the portable kernels takes none).
#include <cmath>
#include <cstring>
#include <limits>
#include <omp.h>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "../../../src/backend/cpu/gemm_f32.h"
#include "../../../src/backend/cpu/weight_kernels.h"
#include "hymoe/backend/ops.h"
#include "hymoe/core/rng.h"

namespace ops = hymoe::ops;
namespace detail = hymoe::ops::detail;

namespace {

std::vector<float> normal(size_t n, uint32_t stream) {
    std::vector<float> x(n);
    hymoe::Philox(11, stream, 0).fill_normal(x.data(), n, 0.0f, 1.0f);
    return x;
}

// One product's operands, with leading dimensions padded past the matrix widths.
struct Problem {
    bool ta, tb;
    int64_t m, n, k;
    float alpha, beta;
    int64_t lda, ldb, ldc;
    std::vector<float> a, b, c0;

    Problem(bool ta_, bool tb_, int64_t m_, int64_t n_, int64_t k_, float alpha_, float beta_)
        : ta(ta_), tb(tb_), m(m_), n(n_), k(k_), alpha(alpha_), beta(beta_) {
        lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 5, ldc = n + 2;
        a = normal(static_cast<size_t>((ta ? k : m) * lda), 1);
        b = normal(static_cast<size_t>((tb ? n : k) * ldb), 2);
        c0 = normal(static_cast<size_t>(m * ldc), 3);
    }
    float at(int64_t i, int64_t p) const {
        return a[static_cast<size_t>(ta ? p * lda + i : i * lda + p)];
    }
    float bt(int64_t p, int64_t j) const {
        return b[static_cast<size_t>(tb ? j * ldb + p : p * ldb + j)];
    }
    // C after the AVX-512 kernel (own = true) or ops::gemm with the portable kernels (OpenBLAS)
    std::vector<float> run(bool own) const {
        std::vector<float> c = c0;
        if (own) {
            detail::f32_gemm_avx512(
                ta, tb, m, n, k, alpha, a.data(), lda, b.data(), ldb, beta, c.data(), ldc);
        } else {
            ops::set_weight_kernel(ops::WeightKernel::portable);
            ops::gemm(ta, tb, m, n, k, alpha, a.data(), lda, b.data(), ldb, beta, c.data(), ldc);
            ops::set_weight_kernel(ops::WeightKernel::automatic);
        }
        return c;
    }
};

// The largest error of `got` against fp64 sums relative to the bound of the file header (≤ 1
// passes) and of `got` against `blas` relative to twice it; the padding of C left alone.
std::pair<double, double> check(const Problem& q,
                                const std::vector<float>& got,
                                const std::vector<float>& blas) {
    const double u = std::ldexp(1.0, -24);
    double worst = 0, worst_blas = 0;
    for (int64_t i = 0; i < q.m; ++i) {
        for (int64_t j = 0; j < q.n; ++j) {
            double ref = 0, mag = 0;
            for (int64_t p = 0; p < q.k; ++p) {
                const double t = double{q.at(i, p)} * double{q.bt(p, j)};
                ref += t, mag += std::abs(t);
            }
            const size_t ij = static_cast<size_t>(i * q.ldc + j);
            const double cin = q.c0[ij];
            const double want = double{q.alpha} * ref + double{q.beta} * cin;
            const double bound =
                static_cast<double>(q.k + 4) * u *
                    (std::abs(double{q.alpha}) * mag + std::abs(double{q.beta} * cin)) +
                1e-30;
            worst = std::max(worst, std::abs(double{got[ij]} - want) / bound);
            worst_blas =
                std::max(worst_blas, std::abs(double{got[ij]} - double{blas[ij]}) / (2 * bound));
        }
        for (int64_t j = q.n; j < q.ldc; ++j) {
            const size_t ij = static_cast<size_t>(i * q.ldc + j);
            BOOST_TEST(got[ij] == q.c0[ij]);
        }
    }
    return {worst, worst_blas};
}

bool skip() {
    if (detail::cpu_has_avx512())
        return false;
    BOOST_TEST_MESSAGE("skipped: this CPU has no AVX-512");
    return true;
}

bool same_bits(const float* x, const float* y, int64_t n) {
    return std::memcmp(x, y, static_cast<size_t>(n) * sizeof(float)) == 0;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(gemm_avx512)

BOOST_AUTO_TEST_CASE(matches_fp64_and_openblas_on_odd_shapes) {
    if (skip())
        return;
    double worst = 0, worst_blas = 0;
    int cases = 0;
    for (bool ta : {false, true})
        for (bool tb : {false, true})
            for (int64_t m : {1, 5, 6, 7, 13, 200})
                for (int64_t n : {1, 15, 16, 17, 64, 65, 130, 200})
                    for (int64_t k : {1, 3, 16, 100, 255, 257, 600}) {
                        if (m * n * k > 2'000'000)
                            continue;
                        const float alpha = (m + k) % 2 ? 1.0f : -0.75f;
                        const float beta = n % 3 == 0 ? 0.0f : n % 3 == 1 ? 1.0f : 0.5f;
                        const Problem q(ta, tb, m, n, k, alpha, beta);
                        const auto [w, wb] = check(q, q.run(true), q.run(false));
                        worst = std::max(worst, w), worst_blas = std::max(worst_blas, wb);
                        ++cases;
                    }
    BOOST_TEST_MESSAGE(cases << " products: worst error / bound " << worst
                             << ", against OpenBLAS / 2 bounds " << worst_blas);
    BOOST_TEST(worst <= 1.0);
    BOOST_TEST(worst_blas <= 1.0);
}

BOOST_AUTO_TEST_CASE(a_row_has_the_same_bits_alone_or_among_others) {
    // each row's K reduction runs in one fixed order whatever m: rows computed alone, or as a
    // block starting anywhere (not on a 6-row tile boundary), equal the rows of the whole product
    if (skip())
        return;
    for (bool ta : {false, true})
        for (bool tb : {false, true}) {
            const Problem q(ta, tb, 97, 150, 531, 0.5f, 1.0f);
            const std::vector<float> all = q.run(true);
            auto rows = [&](int64_t i0, int64_t count) {
                std::vector<float> c(q.c0.begin() + i0 * q.ldc,
                                     q.c0.begin() + (i0 + count) * q.ldc);
                detail::f32_gemm_avx512(ta,
                                        tb,
                                        count,
                                        q.n,
                                        q.k,
                                        q.alpha,
                                        q.a.data() + (ta ? i0 : i0 * q.lda),
                                        q.lda,
                                        q.b.data(),
                                        q.ldb,
                                        q.beta,
                                        c.data(),
                                        q.ldc);
                return c;
            };
            for (int64_t i = 0; i < q.m; i += 7)
                BOOST_TEST(same_bits(rows(i, 1).data(), all.data() + i * q.ldc, q.n),
                           "row " << i << " alone, ta " << ta << " tb " << tb);
            const std::vector<float> block = rows(5, 40);
            BOOST_TEST(same_bits(block.data(), all.data() + 5 * q.ldc, 40 * q.ldc));
        }
}

BOOST_AUTO_TEST_CASE(two_threads_give_the_bits_of_one) {
    // threads split the 64-column panels, never k
    if (skip())
        return;
    const int saved = omp_get_max_threads();
    for (bool ta : {false, true})
        for (bool tb : {false, true}) {
            const Problem q(ta, tb, 130, 333, 300, 1.0f, 0.0f);  // 13 MFLOP: split
            omp_set_num_threads(1);
            const std::vector<float> one = q.run(true);
            omp_set_num_threads(2);
            const std::vector<float> two = q.run(true);
            BOOST_TEST(same_bits(one.data(), two.data(), static_cast<int64_t>(one.size())),
                       "ta " << ta << " tb " << tb);
        }
    omp_set_num_threads(saved);
}

BOOST_AUTO_TEST_CASE(beta_zero_does_not_read_c_and_empty_k_scales_it) {
    if (skip())
        return;
    Problem q(false, true, 9, 70, 20, 1.0f, 0.0f);
    std::fill(q.c0.begin(), q.c0.end(), std::numeric_limits<float>::quiet_NaN());
    const std::vector<float> c = q.run(true);
    for (int64_t i = 0; i < q.m; ++i)
        for (int64_t j = 0; j < q.n; ++j)
            BOOST_TEST(!std::isnan(c[static_cast<size_t>(i * q.ldc + j)]));
    for (float beta : {0.0f, 2.0f}) {
        std::vector<float> cin = normal(6 * 20, 4), out = cin;
        cin[7] = std::numeric_limits<float>::quiet_NaN(), out[7] = cin[7];
        detail::f32_gemm_avx512(
            false, false, 6, 17, 0, 1.0f, nullptr, 1, nullptr, 17, beta, out.data(), 20);
        for (int64_t i = 0; i < 6; ++i)
            for (int64_t j = 0; j < 20; ++j) {
                const size_t ij = static_cast<size_t>(i * 20 + j);
                const float want = j >= 17 ? cin[ij] : beta == 0.0f ? 0.0f : beta * cin[ij];
                BOOST_TEST((std::isnan(want) ? std::isnan(out[ij]) : out[ij] == want));
            }
    }
}

BOOST_AUTO_TEST_CASE(ops_gemm_routes_to_it_and_batch_invariant_runs_keep_rows_independent) {
    if (skip())
        return;
    ops::set_weight_kernel(ops::WeightKernel::automatic);
    // automatic: products of ≥ 2 rows and ≥ 16 columns are the AVX-512 kernel's bits
    const Problem q(false, true, 40, 50, 70, 1.0f, 0.0f);
    std::vector<float> c = q.c0;
    ops::gemm(false,
              true,
              q.m,
              q.n,
              q.k,
              1.0f,
              q.a.data(),
              q.lda,
              q.b.data(),
              q.ldb,
              0.0f,
              c.data(),
              q.ldc);
    const std::vector<float> own = q.run(true);
    BOOST_TEST(same_bits(c.data(), own.data(), static_cast<int64_t>(c.size())));
    // batch-invariant: one row through ops::gemm (sgemv otherwise) is the row of the whole product
    ops::set_batch_invariant(true);
    for (int64_t i : {0, 17, 39}) {
        std::vector<float> one(static_cast<size_t>(q.n));
        ops::gemm(false,
                  true,
                  1,
                  q.n,
                  q.k,
                  1.0f,
                  q.a.data() + i * q.lda,
                  q.lda,
                  q.b.data(),
                  q.ldb,
                  0.0f,
                  one.data(),
                  q.n);
        BOOST_TEST(same_bits(one.data(), own.data() + i * q.ldc, q.n), "row " << i);
    }
    ops::set_batch_invariant(false);
}

BOOST_AUTO_TEST_SUITE_END()
