// Unit tests of the chunked KDA scan's vector kernels (src/backend/cpu/kda_simd.h, private to the
// CPU backend): kda_exp's relative error against the double-precision exponential over the
// non-positive normal range (the bound the header states), its underflow to 0, and
// kda_diag_scores (factors as running products of e^g) and its backward kda_diag_grads (pairwise
// exponentials) against double-precision evaluations of the same sums, with K a multiple of 16 and
// not; kda_token_step, run over a sequence as kda_recurrent runs it, against the recurrence in
// double precision.
#include <cmath>
#include <cstdint>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "../../../src/backend/cpu/kda_simd.h"
#include "hymoe/core/rng.h"

namespace {

using namespace hymoe;
using namespace hymoe::ops;

double d(float f) {
    return static_cast<double>(f);
}

// One head's recurrence over T tokens (spec §3), as the scan's inputs come: q, k unit vectors
// (q × K^{-1/2}), β in (0, 1), g = −g_max·u² with u uniform in (0, 1), a random starting state.
struct TokenRun {
    int64_t T, K, V;
    std::vector<float> q, k, v, g, beta, S0;  // [T, K] ×2, [T, V], [T, K], [T], [K, V]

    TokenRun(int64_t n_tok, int64_t d_k, int64_t d_v, float g_max, Philox& rng)
        : T(n_tok), K(d_k), V(d_v), q(T * K), k(T * K), v(T * V), g(T * K), beta(T), S0(K * V) {
        rng.fill_normal(q.data(), q.size(), 0.0f, 1.0f);
        rng.fill_normal(k.data(), k.size(), 0.0f, 1.0f);
        rng.fill_normal(v.data(), v.size(), 0.0f, 1.0f);
        rng.fill_uniform(g.data(), g.size(), 0.0f, 1.0f);
        rng.fill_uniform(beta.data(), beta.size(), 0.0f, 1.0f);
        rng.fill_normal(S0.data(), S0.size(), 0.0f, 1.0f);
        for (int64_t t = 0; t < T; ++t) {
            unit(&q[t * K], 1.0f / std::sqrt(static_cast<float>(K)));
            unit(&k[t * K], 1.0f);
        }
        for (float& x : g)
            x = -g_max * x * x;
    }
    void unit(float* x, float scale) const {
        double n = 0;
        for (int64_t i = 0; i < K; ++i)
            n += d(x[i]) * d(x[i]);
        for (int64_t i = 0; i < K; ++i)
            x[i] = static_cast<float>(d(x[i]) * d(scale) / std::sqrt(n));
    }
};

// The recurrence in double: o [T, V] and the final state, returned as o then S.
std::vector<double> recurrence_double(const TokenRun& r) {
    const int64_t K = r.K, V = r.V;
    std::vector<double> S(r.S0.begin(), r.S0.end()), out(r.T * V), u(V);
    for (int64_t t = 0; t < r.T; ++t) {
        std::fill(u.begin(), u.end(), 0.0);
        for (int64_t x = 0; x < K; ++x) {
            const double e = std::exp(d(r.g[t * K + x]));
            for (int64_t y = 0; y < V; ++y) {
                S[x * V + y] *= e;
                u[y] += d(r.k[t * K + x]) * S[x * V + y];
            }
        }
        for (int64_t y = 0; y < V; ++y)
            u[y] = d(r.beta[t]) * (d(r.v[t * V + y]) - u[y]);
        for (int64_t x = 0; x < K; ++x)
            for (int64_t y = 0; y < V; ++y) {
                S[x * V + y] += d(r.k[t * K + x]) * u[y];
                out[t * V + y] += d(r.q[t * K + x]) * S[x * V + y];
            }
    }
    out.insert(out.end(), S.begin(), S.end());
    return out;
}

// The same in plain fp32, one rounding per operation in the formula's order (kda_recurrent before
// kda_token_step): the error any fp32 evaluation of the recurrence starts from.
std::vector<float> recurrence_plain(const TokenRun& r) {
    const int64_t K = r.K, V = r.V;
    std::vector<float> S = r.S0, out(r.T * V), u(V);
    for (int64_t t = 0; t < r.T; ++t) {
        std::fill(u.begin(), u.end(), 0.0f);
        for (int64_t x = 0; x < K; ++x) {
            const float e = std::exp(r.g[t * K + x]);
            for (int64_t y = 0; y < V; ++y) {
                S[x * V + y] *= e;
                u[y] += r.k[t * K + x] * S[x * V + y];
            }
        }
        for (int64_t y = 0; y < V; ++y)
            u[y] = r.beta[t] * (r.v[t * V + y] - u[y]);
        for (int64_t x = 0; x < K; ++x)
            for (int64_t y = 0; y < V; ++y) {
                S[x * V + y] += r.k[t * K + x] * u[y];
                out[t * V + y] += r.q[t * K + x] * S[x * V + y];
            }
    }
    out.insert(out.end(), S.begin(), S.end());
    return out;
}

template <typename F>
double max_abs_diff(const std::vector<F>& a, const std::vector<double>& b) {
    BOOST_REQUIRE_EQUAL(a.size(), b.size());
    double e = 0;
    for (size_t i = 0; i < a.size(); ++i)
        e = std::max(e, std::abs(static_cast<double>(a[i]) - b[i]));
    return e;
}

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
        std::vector<float> q(n * ld), k(n * ld), g(n * K), eg(n * K);
        rng.fill_normal(q.data(), q.size(), 0.0f, 1.0f);
        rng.fill_normal(k.data(), k.size(), 0.0f, 1.0f);
        rng.fill_uniform(g.data(), g.size(), 0.0f, 3.0f);
        for (float& x : g)  // log-decays in (−3, 0]: the factors down a block fall to e^{−45}
            x = -x;
        kda_exp(g.data(), eg.data(), n * K);
        std::vector<float> aqk(n * ldo, NAN), akk(n * ldo, NAN);
        kda_diag_scores(n, K, q.data(), k.data(), ld, eg.data(), aqk.data(), akk.data(), ldo);
        double worst = 0;
        for (int64_t i = 0; i < n; ++i) {
            for (int64_t j = 0; j <= i; ++j) {
                double wq = 0, wk = 0;
                for (int64_t x = 0; x < K; ++x) {
                    double s = 0;  // γ_i − γ_j = Σ_{l=j+1..i} g_l
                    for (int64_t l = j + 1; l <= i; ++l)
                        s += d(g[l * K + x]);
                    const double e = std::exp(s);
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

// The chunked forward's decay products on 37 rows (two full blocks of 16 and a partial one for
// the transposed form) of K = 20 (a partial vector) and 48, rows read ld apart, against the same
// running products in double: every output ≤ 1e-6 of it relatively (≤ 37 roundings of 2^-24
// and kda_exp's 2e-7), and Γ the running sum of g.
BOOST_AUTO_TEST_CASE(decay_products_match_double) {
    Philox rng(13, 0, 0);
    for (int64_t K : {20, 48}) {
        const int64_t n = 37, ld = K + 5, ldo = n + 3;
        std::vector<float> a(n * ld), b(n * ld), g(n * ld), eg(n * K), gam(n * K);
        rng.fill_normal(a.data(), a.size(), 0.0f, 1.0f);
        rng.fill_normal(b.data(), b.size(), 0.0f, 1.0f);
        rng.fill_uniform(g.data(), g.size(), 0.0f, 1.0f);
        for (float& x : g)
            x = -x;
        kda_gates(g.data(), ld, n, K, eg.data(), gam.data());
        std::vector<float> fa(n * K), fb(n * K), fl(n * K), fa1(n * K), bk(n * K), bt(K * ldo);
        std::vector<float> bk1((n - 1) * K), last(K);
        kda_decay_forward(
            a.data(), b.data(), ld, eg.data(), true, n, K, fa.data(), fb.data(), last.data());
        kda_decay_forward(
            a.data(), nullptr, ld, eg.data(), false, n, K, fa1.data(), nullptr, nullptr);
        kda_decay_backward(a.data(), ld, eg.data(), false, n, K, bk.data());
        kda_decay_backward(a.data(), ld, eg.data(), true, n - 1, K, bk1.data());
        kda_decay_backward_t(a.data(), ld, eg.data(), n, K, bt.data(), ldo);
        double worst = 0, worst_gam = 0;
        const auto rel = [&](float got, double want) {
            worst = std::max(worst, std::abs(d(got) - want) / std::max(std::abs(want), 1e-30));
        };
        for (int64_t x = 0; x < K; ++x) {
            double sum = 0;
            for (int64_t i = 0; i < n; ++i) {
                sum += d(g[i * ld + x]);
                worst_gam = std::max(worst_gam, std::abs(d(gam[i * K + x]) - sum));
                double from0 = 0, to_end = 0;  // Σ g over rows [0, i] and (i, n)
                for (int64_t l = 0; l <= i; ++l)
                    from0 += d(g[l * ld + x]);
                const double from1 = from0 - d(g[x]);  // rows (0, i]
                for (int64_t l = i + 1; l < n; ++l)
                    to_end += d(g[l * ld + x]);
                const double ai = d(a[i * ld + x]);
                rel(fa[i * K + x], ai * std::exp(from0));
                rel(fb[i * K + x], d(b[i * ld + x]) * std::exp(from0));
                rel(fa1[i * K + x], ai * std::exp(from1));
                rel(bk[i * K + x], ai * std::exp(to_end));
                rel(bt[x * ldo + i], ai * std::exp(to_end));
                if (i < n - 1)
                    rel(bk1[i * K + x], ai * std::exp(to_end));  // tail: the product up to row n−1
                if (i == n - 1)
                    rel(last[x], std::exp(from0));
            }
        }
        BOOST_TEST(worst <= 1e-6);
        BOOST_TEST(worst_gam <= 1e-5);
        BOOST_TEST_MESSAGE("kda decay products K " << K << ": max relative error " << worst);
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

// kda_token_step (the AVX-512 body on this CPU) and its portable body over 64 tokens (o of every
// token, then the final state) against the recurrence in double, for K = V = 128 (the models' head
// size), sizes that are not multiples of 16, more than one 128-column block (V 144, 300), and
// decays from mild to strong. The bound: the state stays O(1) (a decaying N(0, 1) start plus
// β-weighted updates along unit keys), an fp32 sum of K terms rounds to about √K·ε of that per
// step, and the errors build over the steps mild decay remembers: plain fp32 in the formula's order
// lands at 0.5-4.2e-7 here, the AVX-512 step (one rounding fewer per multiply-add) at 0.5-4.6e-7,
// the portable body (e^g by kda_exp's polynomial) at 0.4-5.1e-7; 2e-6 holds all with margin, and
// each must also stay within twice the plain order's own error.
BOOST_AUTO_TEST_CASE(token_step_matches_double) {
    Philox rng(13, 0, 0);
    for (const auto& [K, V] :
         {std::pair<int64_t, int64_t>{128, 128}, {19, 37}, {16, 144}, {33, 300}})
        for (float g_max : {0.1f, 3.0f}) {
            const TokenRun r(64, K, V, g_max, rng);
            const std::vector<double> want = recurrence_double(r);
            const double plain = max_abs_diff(recurrence_plain(r), want);
            for (auto step : {&kda_token_step, &kda_token_step_portable}) {
                std::vector<float> S = r.S0, out(r.T * V), work(K + V);
                for (int64_t t = 0; t < r.T; ++t)
                    step(K,
                         V,
                         &r.q[t * K],
                         &r.k[t * K],
                         &r.v[t * V],
                         &r.g[t * K],
                         r.beta[t],
                         S.data(),
                         &out[t * V],
                         work.data());
                out.insert(out.end(), S.begin(), S.end());
                const double err = max_abs_diff(out, want);
                BOOST_TEST_MESSAGE((step == &kda_token_step ? "kda_token_step" : "portable body")
                                   << " K " << K << " V " << V << " g_max " << g_max
                                   << ": max abs error " << err << " (plain fp32 order: " << plain
                                   << ")");
                BOOST_TEST(err <= 2e-6);
                BOOST_TEST(err <= 2 * plain + 1e-7);
            }
        }
}

BOOST_AUTO_TEST_SUITE_END()
