// Sampler rules (runtime/sampler.h): greedy = argmax with ties to the smallest id; top-k and top-p
// masks worked out by hand; temperature draws follow softmax(logits / T) for a fixed seed; the
// same (seed, request, token index) always gives the same token; a row's top n (what a device
// sends) gives the whole row's candidates exactly.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "hymoe/core/rng.h"
#include "hymoe/runtime/sampler.h"

using hymoe::runtime::SamplingParams;
namespace rt = hymoe::runtime;

namespace {

std::vector<int64_t> tokens_of(const std::vector<rt::Candidate>& c) {
    std::vector<int64_t> t;
    for (const auto& x : c)
        t.push_back(x.token);
    return t;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(sampler)

BOOST_AUTO_TEST_CASE(greedy_is_argmax_with_ties_to_the_smallest_id) {
    const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f, 1.9f};
    BOOST_TEST(rt::argmax_token(logits.data(), 5) == 1);
    BOOST_TEST(rt::sample_token(logits.data(), 5, SamplingParams{}, 0.99f) == 1);
    auto c = rt::sampler_candidates(logits.data(), 5, SamplingParams{});
    BOOST_TEST(c.size() == 1u);
    BOOST_TEST(c[0].token == 1);
}

BOOST_AUTO_TEST_CASE(top_k_keeps_the_k_largest_in_order) {
    const std::vector<float> logits = {0.0f, 3.0f, 1.0f, 3.0f, 2.0f};
    SamplingParams p{1.0, 3, 1.0};
    auto c = rt::sampler_candidates(logits.data(), 5, p);
    BOOST_TEST(tokens_of(c) == (std::vector<int64_t>{1, 3, 4}), boost::test_tools::per_element());
    // by hand: weights e^0, e^0, e^-1 over their sum
    const double z = 2 + std::exp(-1.0);
    BOOST_TEST(c[0].prob == 1 / z, boost::test_tools::tolerance(1e-12));
    BOOST_TEST(c[2].prob == std::exp(-1.0) / z, boost::test_tools::tolerance(1e-12));
}

BOOST_AUTO_TEST_CASE(top_p_keeps_the_shortest_prefix_reaching_p) {
    // probabilities 0.5, 0.25, 0.125, 0.125 (logits ln of them)
    const std::vector<float> logits = {
        std::log(0.125f), std::log(0.5f), std::log(0.25f), std::log(0.125f)};
    auto c = rt::sampler_candidates(logits.data(), 4, SamplingParams{1.0, 0, 0.7});
    BOOST_TEST(tokens_of(c) == (std::vector<int64_t>{1, 2}), boost::test_tools::per_element());
    BOOST_TEST(c[0].prob == 2.0 / 3.0, boost::test_tools::tolerance(1e-6));
    auto one = rt::sampler_candidates(logits.data(), 4, SamplingParams{1.0, 0, 0.1});
    BOOST_TEST(tokens_of(one) == std::vector<int64_t>{1}, boost::test_tools::per_element());
    auto all = rt::sampler_candidates(logits.data(), 4, SamplingParams{1.0, 0, 0.99});
    // ties in order of id: 0 before 3
    BOOST_TEST(tokens_of(all) == (std::vector<int64_t>{1, 2, 0, 3}),
               boost::test_tools::per_element());
    // top-k then top-p: k = 2 keeps {1, 2}, renormalised 2/3, 1/3; p = 0.5 keeps {1}
    auto both = rt::sampler_candidates(logits.data(), 4, SamplingParams{1.0, 2, 0.5});
    BOOST_TEST(tokens_of(both) == std::vector<int64_t>{1}, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(temperature_draws_follow_the_softmax) {
    const std::vector<float> logits = {1.0f, 0.0f, -1.0f, 0.5f};
    for (double T : {0.5, 1.0, 2.0}) {
        SamplingParams p{T, 0, 1.0};
        std::vector<double> expect(4), seen(4, 0.0);
        double z = 0;
        for (int i = 0; i < 4; ++i)
            z += expect[i] = std::exp(static_cast<double>(logits[i]) / T);
        const int n = 40000;
        for (int k = 0; k < n; ++k) {
            hymoe::Philox rng(7, 3, static_cast<uint32_t>(k));
            seen[rt::sample_token(logits.data(), 4, p, rng.uniform())] += 1.0 / n;
        }
        for (int i = 0; i < 4; ++i)  // 40000 draws: standard error < 0.0025
            BOOST_TEST(std::abs(seen[i] - expect[i] / z) < 0.01, "T " << T << " token " << i);
    }
}

BOOST_AUTO_TEST_CASE(same_seed_request_and_index_give_the_same_token) {
    std::vector<float> logits(256);
    hymoe::Philox init(1, 0, 0);
    init.fill_normal(logits.data(), logits.size(), 0.0f, 1.0f);
    SamplingParams p{0.8, 50, 0.9};
    std::vector<int64_t> a, b, other;
    for (uint32_t k = 0; k < 64; ++k) {
        a.push_back(rt::sample_token(logits.data(), 256, p, hymoe::Philox(5, 17, k).uniform()));
        b.push_back(rt::sample_token(logits.data(), 256, p, hymoe::Philox(5, 17, k).uniform()));
        other.push_back(rt::sample_token(logits.data(), 256, p, hymoe::Philox(5, 18, k).uniform()));
    }
    BOOST_TEST(a == b, boost::test_tools::per_element());
    BOOST_TEST(a != other);  // another request draws differently
}

BOOST_AUTO_TEST_CASE(token_logprob_is_the_raw_log_softmax) {
    const std::vector<float> logits = {0.0f, std::log(3.0f)};
    BOOST_TEST(rt::token_logprob(logits.data(), 2, 1) == std::log(0.75),
               boost::test_tools::tolerance(1e-7));
}

BOOST_AUTO_TEST_CASE(a_rows_top_n_gives_the_whole_rows_candidates) {
    const int64_t V = 300;
    hymoe::Philox rng(4, 0, 0);
    for (int row = 0; row < 20; ++row) {
        std::vector<float> logits(V);  // coarse values: many ties
        rng.fill_normal(logits.data(), logits.size(), 0.0f, 2.0f);
        for (float& x : logits)
            x = std::round(x * 4) / 4;
        for (const SamplingParams& p : {SamplingParams{},
                                        SamplingParams{0.7, 1, 1.0},
                                        SamplingParams{1.0, 8, 1.0},
                                        SamplingParams{0.8, 50, 0.9},
                                        SamplingParams{1.3, 40, 0.3}}) {
            const int64_t n = std::max(p.top_k, 1) + row % 3;  // at least what the rules read
            std::vector<int64_t> order(V);
            std::iota(order.begin(), order.end(), int64_t{0});
            std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
                return logits[a] > logits[b];
            });
            std::vector<float> top(static_cast<size_t>(n));
            for (int64_t i = 0; i < n; ++i)
                top[i] = logits[order[i]];
            const auto whole = rt::sampler_candidates(logits.data(), V, p);
            const auto part = rt::sampler_candidates_sorted(order.data(), top.data(), n, p);
            BOOST_TEST_REQUIRE(part.size() == whole.size());
            for (size_t i = 0; i < part.size(); ++i) {
                BOOST_TEST(part[i].token == whole[i].token);
                BOOST_TEST(part[i].prob == whole[i].prob);  // the same sums in the same order
            }
            const float u = rng.uniform();
            BOOST_TEST(rt::draw_candidate(part, u) == rt::sample_token(logits.data(), V, p, u));
        }
    }
}

BOOST_AUTO_TEST_SUITE_END()
