// Unit tests of the chunked KDA scan's vector kernels (src/backend/cpu/kda_simd.h, private to the
// CPU backend): kda_exp's relative error against the double-precision exponential over the
// non-positive normal range (the bound the header states), its underflow to 0, and
// kda_diag_scores and its backward kda_diag_grads against double-precision evaluations of the
// same pairwise-exponential sums, with K a multiple of 16 and not.
#include <cmath>
#include <cstdint>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "../../../src/backend/cpu/kda_simd.h"
#include "hymoe/core/rng.h"

namespace {

using namespace hymoe;
using namespace hymoe::ops;

}  // namespace

BOOST_AUTO_TEST_SUITE(kda_simd)

BOOST_AUTO_TEST_CASE(exp_relative_error) {
    const int64_t n = 2000003;  // odd: the vector body's partial tail runs too
    std::vector<float> x(n), y(n);
    for (int64_t i = 0; i < n; ++i)
        x[i] = -87.3f * static_cast<float>(i) / static_cast<float>(n - 1);
    kda_exp(x.data(), y.data(), n);
    double worst = 0;
    for (int64_t i = 0; i < n; ++i) {
        const double want = std::exp(static_cast<double>(x[i]));
        worst = std::max(worst, std::abs(static_cast<double>(y[i]) - want) / want);
    }
    BOOST_TEST(worst <= 2e-7);
    BOOST_TEST_MESSAGE("kda_exp max relative error on [-87.3, 0]: " << worst);
    const std::vector<float> low{-104.0f, -200.0f, -1e30f, -INFINITY, 0.0f};
    std::vector<float> e(low.size());
    kda_exp(low.data(), e.data(), static_cast<int64_t>(low.size()));
    for (size_t i = 0; i + 1 < low.size(); ++i)
        BOOST_TEST(e[i] == 0.0f);
    BOOST_TEST(e.back() == 1.0f);
}

BOOST_AUTO_TEST_CASE(diag_scores_match_double) {
    Philox rng(11, 0, 0);
    for (int64_t K : {32, 20}) {
        const int64_t n = 16, ld = K + 3, ldo = 19;
        std::vector<float> q(n * ld), k(n * ld), g(n * K), gam(n * K);
        rng.fill_normal(q.data(), q.size(), 0.0f, 1.0f);
        rng.fill_normal(k.data(), k.size(), 0.0f, 1.0f);
        rng.fill_uniform(g.data(), g.size(), 0.0f, 3.0f);
        for (int64_t i = 0; i < n; ++i)  // γ: cumulative sums of −g, falling down the rows
            for (int64_t x = 0; x < K; ++x)
                gam[i * K + x] = (i ? gam[(i - 1) * K + x] : 0.0f) - g[i * K + x];
        std::vector<float> aqk(n * ldo, NAN), akk(n * ldo, NAN);
        kda_diag_scores(n, K, q.data(), k.data(), ld, gam.data(), aqk.data(), akk.data(), ldo);
        double worst = 0;
        for (int64_t i = 0; i < n; ++i) {
            for (int64_t j = 0; j <= i; ++j) {
                double wq = 0, wk = 0;
                const auto d = [](float f) { return static_cast<double>(f); };
                for (int64_t x = 0; x < K; ++x) {
                    const double e = std::exp(d(gam[i * K + x]) - d(gam[j * K + x]));
                    wq += d(q[i * ld + x]) * d(k[j * ld + x]) * e;
                    wk += d(k[i * ld + x]) * d(k[j * ld + x]) * e;
                }
                worst = std::max({worst,
                                  std::abs(d(aqk[i * ldo + j]) - wq),
                                  std::abs(d(akk[i * ldo + j]) - wk)});
            }
            for (int64_t j = i + 1; j < n; ++j)  // above the diagonal: not written
                BOOST_TEST(std::isnan(aqk[i * ldo + j]));
        }
        BOOST_TEST(worst <= 1e-5);
        BOOST_TEST_MESSAGE("kda_diag_scores K " << K << ": max abs error " << worst);
    }
}

// kda_diag_grads on a block of 13 rows (not a full 16) with accumulators that start non-zero,
// against a double evaluation of the same sums; the diagonal of daqk/dakk is not read.
BOOST_AUTO_TEST_CASE(diag_grads_match_double) {
    Philox rng(12, 0, 0);
    for (int64_t K : {32, 20}) {
        const int64_t n = 13, ld = K + 3, ldd = 17;
        std::vector<float> q(n * ld), k(n * ld), g(n * K), gam(n * K), daqk(n * ldd), dakk(n * ldd);
        rng.fill_normal(q.data(), q.size(), 0.0f, 1.0f);
        rng.fill_normal(k.data(), k.size(), 0.0f, 1.0f);
        rng.fill_normal(daqk.data(), daqk.size(), 0.0f, 1.0f);
        rng.fill_normal(dakk.data(), dakk.size(), 0.0f, 1.0f);
        rng.fill_uniform(g.data(), g.size(), 0.0f, 3.0f);
        for (int64_t i = 0; i < n; ++i) {
            for (int64_t x = 0; x < K; ++x)
                gam[i * K + x] = (i ? gam[(i - 1) * K + x] : 0.0f) - g[i * K + x];
            daqk[i * ldd + i] = dakk[i * ldd + i] = NAN;  // must not be read
        }
        std::vector<float> dqa(n * K), dkr(n * K), dkc(n * K);
        rng.fill_normal(dqa.data(), dqa.size(), 0.0f, 1.0f);
        rng.fill_normal(dkr.data(), dkr.size(), 0.0f, 1.0f);
        rng.fill_normal(dkc.data(), dkc.size(), 0.0f, 1.0f);
        const auto d = [](float f) { return static_cast<double>(f); };
        std::vector<double> wqa(dqa.begin(), dqa.end()), wkr(dkr.begin(), dkr.end());
        std::vector<double> wkc(dkc.begin(), dkc.end());
        for (int64_t i = 0; i < n; ++i)
            for (int64_t j = 0; j < i; ++j)
                for (int64_t x = 0; x < K; ++x) {
                    const double e = std::exp(d(gam[i * K + x]) - d(gam[j * K + x]));
                    const double a = d(daqk[i * ldd + j]), m = d(dakk[i * ldd + j]);
                    wqa[i * K + x] += a * d(k[j * ld + x]) * e;
                    wkr[i * K + x] += m * d(k[j * ld + x]) * e;
                    wkc[j * K + x] += (a * d(q[i * ld + x]) + m * d(k[i * ld + x])) * e;
                }
        kda_diag_grads(n,
                       K,
                       q.data(),
                       k.data(),
                       ld,
                       gam.data(),
                       daqk.data(),
                       dakk.data(),
                       ldd,
                       dqa.data(),
                       dkr.data(),
                       dkc.data());
        double worst = 0;
        for (int64_t i = 0; i < n * K; ++i)
            worst = std::max({worst,
                              std::abs(d(dqa[i]) - wqa[i]),
                              std::abs(d(dkr[i]) - wkr[i]),
                              std::abs(d(dkc[i]) - wkc[i])});
        BOOST_TEST(worst <= 1e-5);
        BOOST_TEST_MESSAGE("kda_diag_grads K " << K << ": max abs error " << worst);
    }
}

BOOST_AUTO_TEST_SUITE_END()
