// Sampler rules (runtime/sampler.h): greedy = argmax with ties to the smallest id; top-k and top-p
// masks worked out by hand; temperature draws follow softmax(logits / T) for a fixed seed; the
// same (seed, request, token index) always gives the same token; a row's top n (what a device
// sends) gives the whole row's candidates exactly; min_p and the presence, frequency and
// repetition penalties against their definitions worked out by hand on small rows.
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
                                        SamplingParams{1.3, 40, 0.3},
                                        SamplingParams{0.9, 40, 0.95, 0.05}}) {
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

// min_p keeps p ≥ min_p · p_max after the temperature: logits ln 8, ln 4, ln 2, ln 1 at T = 1
// are p ∝ 8, 4, 2, 1 (ratios to the top 1, 1/2, 1/4, 1/8), so min_p 0.24 keeps {8, 4, 2} and
// 0.3 keeps {8, 4}; at T = 0.5 the ratios square (1, 1/4, 1/16, 1/64), so 0.2 keeps {8, 4}. Then
// top_p runs on what min_p left: p = 0.6 of {8/14, 4/14, 2/14} keeps the first two.
BOOST_AUTO_TEST_CASE(min_p_drops_tokens_below_min_p_times_the_top_probability) {
    const std::vector<float> logits = {
        std::log(2.0f), std::log(8.0f), std::log(1.0f), std::log(4.0f)};
    auto with = [](double T, double min_p, double top_p) {
        SamplingParams p{T, 0, top_p};
        p.min_p = min_p;
        return p;
    };
    auto c = rt::sampler_candidates(logits.data(), 4, with(1.0, 0.24, 1.0));
    BOOST_TEST(tokens_of(c) == (std::vector<int64_t>{1, 3, 0}), boost::test_tools::per_element());
    BOOST_TEST(c[0].prob == 8.0 / 14.0, boost::test_tools::tolerance(1e-6));
    BOOST_TEST(c[2].prob == 2.0 / 14.0, boost::test_tools::tolerance(1e-6));
    c = rt::sampler_candidates(logits.data(), 4, with(1.0, 0.3, 1.0));
    BOOST_TEST(tokens_of(c) == (std::vector<int64_t>{1, 3}), boost::test_tools::per_element());
    c = rt::sampler_candidates(logits.data(), 4, with(0.5, 0.2, 1.0));
    BOOST_TEST(tokens_of(c) == (std::vector<int64_t>{1, 3}), boost::test_tools::per_element());
    BOOST_TEST(c[0].prob == 64.0 / 80.0, boost::test_tools::tolerance(1e-6));
    c = rt::sampler_candidates(logits.data(), 4, with(1.0, 0.24, 0.6));
    BOOST_TEST(tokens_of(c) == (std::vector<int64_t>{1, 3}), boost::test_tools::per_element());
    c = rt::sampler_candidates(logits.data(), 4, with(1.0, 1.0, 1.0));  // only the top
    BOOST_TEST(tokens_of(c) == std::vector<int64_t>{1}, boost::test_tools::per_element());
    // the draw: u below 8/14 gives token 1, between 8/14 and 12/14 token 3, above it token 0
    BOOST_TEST(rt::sample_token(logits.data(), 4, with(1.0, 0.24, 1.0), 0.5f) == 1);
    BOOST_TEST(rt::sample_token(logits.data(), 4, with(1.0, 0.24, 1.0), 0.8f) == 3);
    BOOST_TEST(rt::sample_token(logits.data(), 4, with(1.0, 0.24, 1.0), 0.95f) == 0);
}

// The penalties on a 6-token row, by hand. Prompt {0, 4}, output {2, 2, 3}:
//   repetition 2 on the seen tokens {0, 2, 3, 4}: 1.0 → 0.5, −1.0 → −2.0, 3.0 → 1.5, −0.5 → −1.0
//   frequency 0.25 on the output counts (2: 2, 3: 1): 2 loses 0.5, 3 loses 0.25
//   presence 0.5 on the output tokens {2, 3}: each loses 0.5; tokens 1 and 5 are untouched.
BOOST_AUTO_TEST_CASE(penalties_follow_vllms_definition) {
    const std::vector<float> raw = {1.0f, 2.0f, -1.0f, 3.0f, -0.5f, 0.25f};
    const std::vector<int64_t> prompt = {0, 4}, output = {2, 3, 2};
    SamplingParams p;
    p.repetition_penalty = 2, p.frequency_penalty = 0.25, p.presence_penalty = 0.5;
    BOOST_TEST(p.penalised());
    std::vector<float> x = raw;
    rt::apply_penalties(x.data(), 6, p, prompt.data(), 2, output.data(), 3);
    const std::vector<float> want = {
        0.5f, 2.0f, -2.0f - 0.5f - 0.5f, 1.5f - 0.25f - 0.5f, -1.0f, 0.25f};
    BOOST_TEST(x == want, boost::test_tools::per_element());
    // each alone
    auto only = [&](double rep, double freq, double pres) {
        SamplingParams q;
        q.repetition_penalty = rep, q.frequency_penalty = freq, q.presence_penalty = pres;
        std::vector<float> y = raw;
        rt::apply_penalties(y.data(), 6, q, prompt.data(), 2, output.data(), 3);
        return y;
    };
    BOOST_TEST(only(2, 0, 0) == (std::vector<float>{0.5f, 2.0f, -2.0f, 1.5f, -1.0f, 0.25f}),
               boost::test_tools::per_element());
    BOOST_TEST(only(1, 0.25, 0) == (std::vector<float>{1.0f, 2.0f, -1.5f, 2.75f, -0.5f, 0.25f}),
               boost::test_tools::per_element());
    BOOST_TEST(only(1, 0, -1) == (std::vector<float>{1.0f, 2.0f, 0.0f, 4.0f, -0.5f, 0.25f}),
               boost::test_tools::per_element());
    BOOST_TEST(!SamplingParams{}.penalised());
    // greedy reads the penalised row: the raw argmax 3 falls to 0.75, so 1 (2.0) wins
    BOOST_TEST(rt::argmax_token(raw.data(), 6) == 3);
    BOOST_TEST(rt::argmax_token(x.data(), 6) == 1);
}

BOOST_AUTO_TEST_SUITE_END()
