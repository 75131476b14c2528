// Unit tests of the fp32 DSA indexer scores (ops::indexer_scores; the indexer of an fp32 KV
// cache): on both paths (the fused AVX-512 kernel where the CPU has AVX-512F, the GEMM + fold of
// the portable kernels) against a plain loop over the order of reduction the fused kernel
// documents (indexer_f32.cpp: per head and key one fused multiply-add chain over the dims from 0,
// then from +0 the heads in order, each a rounded product w·ReLU then a rounded add), bit for bit
// on the fused path, within the fp32 error bound of the exact scores on both:
//   |fp32 − exact| ≤ A·[γ_d + γ_{H+1}(1 + γ_d)],  A = Σ_j |w_j| Σ_i |q_j,i k_i|,
// (γ_n = n·2⁻²⁴/(1 − n·2⁻²⁴), test_indexer_bf16.cpp derives it). Shapes off every block of both
// forms of the kernel (rows: 1–2 queries; tiles: more): key counts off the 16-key tile, the 3-tile
// register block and the 384-key chunk; head counts off the 8-head and 16-lane groups; d 7 … 128;
// 2 OpenMP threads give 1 thread's bits. Equal keys score equal wherever they sit, so the top-k
// over the fused scores keeps ops::top_k's keys (ties to the smaller index); the causal query
// blocks of a prefill and decode steps select the plain loop's keys; ops::indexer_select on both
// paths keeps ops::top_k's keys.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <omp.h>
#include <tuple>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "hymoe/backend/ops.h"
#include "hymoe/backend/ops_attention.h"
#include "hymoe/core/rng.h"

namespace {

using namespace hymoe;

double f64(float v) {
    return static_cast<double>(v);
}

double gamma_n(double n) {
    const double e = n * std::ldexp(1.0, -24);
    return e / (1.0 - e);
}

// fp32 a·b and a + b, each rounded once: the double result of two floats rounded to float (53 ≥
// 2·24 + 2 bits, so the double rounding is innocuous), immune to the compiler contracting them.
float mul32(float a, float b) {
    return static_cast<float>(f64(a) * f64(b));
}
float add32(float a, float b) {
    return static_cast<float>(f64(a) + f64(b));
}

Tensor view(std::vector<float>& v, Shape shape, int64_t offset = 0) {
    return Tensor{v.data() + offset, DType::f32, Device::cpu, std::move(shape)};
}

// Queries [n_q, h, d], head weights [n_q, h], keys [n_k, d]: keys k_s = tanh(m_s) + N(0, 1),
// queries 1/2 + N(0, 1), weights N(0, 1) (scores of both signs; some heads ReLU'd to zero).
struct Case {
    int64_t n_q, h, d, n_k;
    std::vector<float> q, w, k;
    Case(int64_t n_q_, int64_t h_, int64_t d_, int64_t n_k_, uint64_t seed)
        : n_q(n_q_), h(h_), d(d_), n_k(n_k_), q(n_q * h * d), w(n_q * h), k(n_k * d) {
        Philox rng(seed, 0, 0);
        rng.fill_normal(q.data(), q.size(), 0.5f, 1.0f);
        rng.fill_normal(w.data(), w.size(), 0.0f, 1.0f);
        rng.fill_normal(k.data(), k.size(), 0.0f, 1.0f);
        std::vector<float> m(static_cast<size_t>(n_k));
        rng.fill_normal(m.data(), m.size(), 0.0f, 1.0f);
        for (int64_t s = 0; s < n_k; ++s)
            for (int64_t e = 0; e < d; ++e)
                k[s * d + e] += std::tanh(m[s]);
    }
    // ops::indexer_scores [n_q, n_k]
    std::vector<float> scores() {
        std::vector<float> s(static_cast<size_t>(n_q * n_k), 12345.0f);
        Tensor sv = view(s, {n_q, n_k});
        ops::indexer_scores(view(q, {n_q, h * d}), view(w, {n_q, h}), view(k, {n_k, d}), sv);
        return s;
    }
    // the plain loop in the documented order, score (t, s)
    float reference(int64_t t, int64_t s) const {
        float score = 0.0f;
        for (int64_t j = 0; j < h; ++j) {
            const float* qj = q.data() + (t * h + j) * d;
            float dot = 0.0f;
            for (int64_t e = 0; e < d; ++e)
                dot = std::fma(qj[e], k[s * d + e], dot);
            score = add32(score, mul32(w[t * h + j], std::max(dot, 0.0f)));
        }
        return score;
    }
    // the exact score (t, s) in double and its fp32 bound
    std::pair<double, double> exact(int64_t t, int64_t s) const {
        double x = 0, a = 0;
        for (int64_t j = 0; j < h; ++j) {
            double dot = 0, aj = 0;
            for (int64_t e = 0; e < d; ++e) {
                dot += f64(q[(t * h + j) * d + e]) * f64(k[s * d + e]);
                aj += std::abs(f64(q[(t * h + j) * d + e]) * f64(k[s * d + e]));
            }
            x += f64(w[t * h + j]) * std::max(dot, 0.0);
            a += std::abs(f64(w[t * h + j])) * aj;
        }
        const double gd = gamma_n(static_cast<double>(d));
        return {x, a * (gd + gamma_n(static_cast<double>(h + 1)) * (1 + gd))};
    }
};

// Runs `body` with the kernels forced to kernel (portable: the GEMM + fold path).
template <typename F>
void with_kernel(ops::WeightKernel kernel, F body) {
    ops::set_weight_kernel(kernel);
    body();
    ops::set_weight_kernel(ops::WeightKernel::automatic);
}

// The fused path when this CPU has AVX-512F, and the portable one.
std::vector<ops::WeightKernel> kernels() {
    ops::set_weight_kernel(ops::WeightKernel::automatic);
    std::vector<ops::WeightKernel> all{ops::WeightKernel::portable};
    if (ops::weight_kernel() != ops::WeightKernel::portable)
        all.push_back(ops::weight_kernel());
    else
        BOOST_TEST_MESSAGE("this CPU has no AVX-512F: the portable (GEMM) path only");
    return all;
}

// The case below for n_q queries.
void equal_keys_case(int64_t n_q) {
    const int64_t n_k = 803, d = 64, h = 16, top_k = 40, rows = 7;
    Case c(n_q, h, d, n_k, 11);
    for (int64_t s = rows; s < n_k; ++s)
        std::copy_n(c.k.data() + (3 * s % rows) * d, d, c.k.data() + s * d);
    const std::vector<float> x = c.scores();
    int64_t unequal = 0;
    for (int64_t t = 0; t < n_q; ++t)
        for (int64_t s = rows; s < n_k; ++s)
            unequal += x[t * n_k + s] != x[t * n_k + 3 * s % rows];
    BOOST_TEST(unequal == 0);
    std::vector<int64_t> keep(static_cast<size_t>(n_q * top_k)), n_keep(n_q);
    ops::indexer_select(view(const_cast<std::vector<float>&>(x), {n_q, n_k}),
                        n_k - n_q,
                        top_k,
                        keep.data(),
                        n_keep.data());
    for (int64_t t = 0; t < n_q; ++t) {
        const int64_t visible = n_k - n_q + t + 1;
        std::vector<int64_t> want(static_cast<size_t>(top_k));
        ops::top_k(x.data() + t * n_k, visible, top_k, want.data());
        BOOST_TEST(x[t * n_k + want.front()] == x[t * n_k + want.back()]);  // a tie cut
        std::sort(want.begin(), want.end());
        BOOST_TEST(n_keep[t] == top_k);
        BOOST_TEST(std::equal(want.begin(), want.end(), keep.begin() + t * top_k));
    }
}

}  // namespace

BOOST_AUTO_TEST_SUITE(indexer_f32)

// Every shape: fused scores = the plain loop bit for bit; both paths within the fp32 bound of the
// exact scores.
BOOST_AUTO_TEST_CASE(scores_equal_the_plain_loop_and_lie_within_the_fp32_bound) {
    // (n_q, H, d, n_k); one or two queries run the fused kernel's rows form, more its tiles form
    const std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t>> shapes{{1, 16, 64, 1},
                                                                             {1, 16, 64, 15},
                                                                             {1, 16, 64, 5000},
                                                                             {3, 16, 16, 17},
                                                                             {5, 16, 32, 47},
                                                                             {7, 16, 128, 48},
                                                                             {2, 15, 64, 49},
                                                                             {37, 12, 64, 53},
                                                                             {4, 3, 7, 385},
                                                                             {20, 9, 30, 200},
                                                                             {6, 1, 128, 800},
                                                                             {9, 64, 128, 97},
                                                                             {11, 13, 33, 384},
                                                                             {1, 16, 64, 767},
                                                                             {1, 3, 7, 385},
                                                                             {2, 64, 128, 97},
                                                                             {1, 1, 32, 50},
                                                                             {2, 17, 33, 300},
                                                                             {1, 16, 16, 8}};
    for (ops::WeightKernel kernel : kernels())
        with_kernel(kernel, [&] {
            const bool fused = ops::weight_kernel() != ops::WeightKernel::portable;
            double worst = 0;
            int64_t differ = 0, total = 0;
            for (auto [n_q, h, d, n_k] : shapes) {
                Case c(n_q, h, d, n_k, static_cast<uint64_t>(n_q * 131 + h * 7 + d + n_k));
                const std::vector<float> x = c.scores();
                for (int64_t t = 0; t < n_q; ++t)
                    for (int64_t s = 0; s < n_k; ++s) {
                        const float xv = x[t * n_k + s], rv = c.reference(t, s);
                        const auto [ex, bound] = c.exact(t, s);
                        worst = std::max(worst, std::abs(f64(xv) - ex) / bound);
                        differ += xv != rv;
                        ++total;
                        if (fused && xv != rv)
                            BOOST_TEST_MESSAGE("(" << n_q << ", " << h << ", " << d << ", " << n_k
                                                   << ") score " << t << ", " << s << ": " << xv
                                                   << " != " << rv);
                    }
            }
            BOOST_TEST_MESSAGE(ops::to_string(ops::weight_kernel())
                               << ": worst |fp32 − exact| / bound " << worst << ", " << differ
                               << " of " << total << " scores differ from the plain loop");
            BOOST_TEST(worst <= 1.0);
            if (fused)
                BOOST_TEST(differ == 0);
        });
}

// OpenMP threads split query blocks (tiles form) or key chunks (rows form): 2 threads give the
// bits of 1, on calls large enough to be split.
BOOST_AUTO_TEST_CASE(two_threads_give_the_bits_of_one) {
    const int saved = omp_get_max_threads();
    for (auto [n_q, h, d, n_k] : {std::tuple{1, 16, 64, 9000},
                                  std::tuple{2, 16, 64, 5000},
                                  std::tuple{256, 16, 64, 300},
                                  std::tuple{40, 9, 128, 1000}}) {
        Case c(n_q, h, d, n_k, 17);
        omp_set_num_threads(1);
        const std::vector<float> one = c.scores();
        omp_set_num_threads(2);
        const std::vector<float> two = c.scores();
        BOOST_TEST((one == two));
    }
    omp_set_num_threads(saved);
}

// Keys of 7 distinct rows, key s a copy of row 3s mod 7 (each row in every lane, tile, register
// block and chunk, and in the last, partial tile): on the fused path copies score bit-equal (the
// OpenBLAS GEMM of the portable path does not promise it), and a top-40 cuts within the ~115
// copies of the best row: the kept keys are ops::top_k's (ties to the smaller index).
BOOST_AUTO_TEST_CASE(equal_keys_score_equal_and_the_topk_keeps_the_smaller_index) {
    if (kernels().size() == 1)  // no AVX-512F: no fused path
        return;
    for (int64_t n_q : {1, 3})  // the rows form, the tiles form
        equal_keys_case(n_q);
}

// New tokens as model/attention.cpp runs them after 100 cached ones: a prefill by query blocks of
// 48 (the tiles form) and decode steps of one query (the rows form), each block over its visible
// keys only, then the causal top-k mask: the kept keys are the plain loop's.
BOOST_AUTO_TEST_CASE(causal_query_blocks_select_the_plain_loops_keys) {
    const int64_t pos0 = 100, n_new = 130, n_k = pos0 + n_new, h = 16, d = 64, top_k = 24;
    Case c(n_new, h, d, n_k, 5);
    for (ops::WeightKernel kernel : kernels())
        for (int64_t block : {48, 1})
            with_kernel(kernel, [&] {
                int64_t wrong = 0;
                for (int64_t i0 = 0; i0 < n_new; i0 += block) {
                    const int64_t n_b = std::min(block, n_new - i0), n_kb = pos0 + i0 + n_b;
                    std::vector<float> s(static_cast<size_t>(n_b * n_kb)), m(s.size());
                    Tensor sv = view(s, {n_b, n_kb}), mv = view(m, {n_b, n_kb});
                    ops::indexer_scores(view(c.q, {n_b, h * d}, i0 * h * d),
                                        view(c.w, {n_b, h}, i0 * h),
                                        view(c.k, {n_kb, d}),
                                        sv);
                    ops::indexer_mask(sv, pos0 + i0, top_k, mv);
                    for (int64_t b = 0; b < n_b; ++b) {
                        const int64_t visible = pos0 + i0 + b + 1;
                        std::vector<float> ref(static_cast<size_t>(visible));
                        for (int64_t u = 0; u < visible; ++u)
                            ref[u] = c.reference(i0 + b, u);
                        std::vector<int64_t> want(static_cast<size_t>(top_k));
                        ops::top_k(ref.data(), visible, top_k, want.data());
                        std::vector<char> kept(static_cast<size_t>(n_kb), 0);
                        for (int64_t u : want)
                            kept[u] = 1;
                        for (int64_t u = 0; u < n_kb; ++u)
                            wrong += (m[b * n_kb + u] == 0.0f) != (kept[u] == 1);
                    }
                }
                BOOST_TEST_MESSAGE(ops::to_string(ops::weight_kernel())
                                   << ", blocks of " << block << ": " << wrong
                                   << " mask entries off the plain loop's top-k");
                BOOST_TEST(wrong == 0);
            });
}

// ops::indexer_select on both paths (the AVX-512 bisection, the portable histogram) = ops::top_k
// over each query's visible keys: scores rounded to few values (ties everywhere, the cut inside
// a run of equal scores), zeros of both signs, negatives, infinities; rows from 1 to 70000 keys,
// k from 1 to every visible key.
BOOST_AUTO_TEST_CASE(selection_keeps_top_k_of_the_visible_keys) {
    const std::vector<std::tuple<int64_t, int64_t, int64_t, float>> cases{
        // (n_q, n_k, top-k, rounding step: 0 = none)
        {1, 1, 4, 0.0f},
        {5, 17, 3, 0.5f},
        {40, 300, 16, 0.25f},
        {40, 300, 300, 0.0f},
        {3, 1000, 256, 1.0f},
        {2, 70000, 256, 0.0f},
        {2, 70000, 2048, 0.125f},
        {9, 33, 1, 2.0f}};
    for (ops::WeightKernel kernel : kernels())
        with_kernel(kernel, [&] {
            int64_t wrong = 0;
            for (auto [n_q, n_k, top_k, step] : cases) {
                std::vector<float> x(static_cast<size_t>(n_q * n_k));
                Philox rng(static_cast<uint64_t>(n_k + top_k), 0, 0);
                rng.fill_normal(x.data(), x.size(), 0.0f, 3.0f);
                for (size_t i = 0; i < x.size(); ++i) {
                    if (step > 0.0f)
                        x[i] = std::round(x[i] / step) * step;  // ±0 among them
                    if (i % 97 == 5)
                        x[i] = -0.0f;
                    if (i % 389 == 7)
                        x[i] = i % 2 ? std::numeric_limits<float>::infinity()
                                     : -std::numeric_limits<float>::infinity();
                }
                std::vector<int64_t> keep(static_cast<size_t>(n_q * top_k)), n_keep(n_q);
                ops::indexer_select(
                    view(x, {n_q, n_k}), n_k - n_q, top_k, keep.data(), n_keep.data());
                for (int64_t t = 0; t < n_q; ++t) {
                    const int64_t visible = n_k - n_q + t + 1, k = std::min(top_k, visible);
                    std::vector<int64_t> want(static_cast<size_t>(k));
                    ops::top_k(x.data() + t * n_k, visible, k, want.data());
                    std::sort(want.begin(), want.end());
                    wrong += n_keep[t] != k ||
                             !std::equal(want.begin(), want.end(), keep.begin() + t * top_k);
                }
            }
            BOOST_TEST_MESSAGE(ops::to_string(ops::weight_kernel())
                               << ": " << wrong << " rows off ops::top_k");
            BOOST_TEST(wrong == 0);
        });
}

BOOST_AUTO_TEST_SUITE_END()
