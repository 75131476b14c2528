// Greedy / temperature / top-k / top-p sampling (see runtime/sampler.h for the rules).
#include "hymoe/runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace hymoe::runtime {

int64_t argmax_token(const float* logits, int64_t V) {
    return std::max_element(logits, logits + V) - logits;  // the first maximum: smallest id
}

double token_logprob(const float* logits, int64_t V, int64_t token) {
    const double mx = static_cast<double>(logits[argmax_token(logits, V)]);
    double sum = 0;
    for (int64_t j = 0; j < V; ++j)
        sum += std::exp(static_cast<double>(logits[j]) - mx);
    return static_cast<double>(logits[token]) - mx - std::log(sum);
}

void top_logprobs(const float* logits, int64_t V, int n, int64_t* tokens, float* logprobs) {
    std::vector<int64_t> order(static_cast<size_t>(V));
    std::iota(order.begin(), order.end(), int64_t{0});
    std::partial_sort(order.begin(), order.begin() + n, order.end(), [&](int64_t a, int64_t b) {
        return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    const double mx = static_cast<double>(logits[order[0]]);
    double sum = 0;
    for (int64_t j = 0; j < V; ++j)
        sum += std::exp(static_cast<double>(logits[j]) - mx);
    for (int i = 0; i < n; ++i) {
        tokens[i] = order[static_cast<size_t>(i)];
        logprobs[i] =
            static_cast<float>(static_cast<double>(logits[tokens[i]]) - mx - std::log(sum));
    }
}

std::vector<Candidate> sampler_candidates(const float* logits, int64_t V, const SamplingParams& p) {
    if (p.temperature <= 0)
        return {{argmax_token(logits, V), 1.0}};
    const int64_t kept = (p.top_k > 0 && p.top_k < V) ? p.top_k : V;
    std::vector<int64_t> order(static_cast<size_t>(V));
    std::iota(order.begin(), order.end(), int64_t{0});
    std::partial_sort(order.begin(), order.begin() + kept, order.end(), [&](int64_t a, int64_t b) {
        return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    order.resize(static_cast<size_t>(kept));
    std::vector<float> values(order.size());  // [kept]
    for (size_t i = 0; i < order.size(); ++i)
        values[i] = logits[order[i]];
    return sampler_candidates_sorted(order.data(), values.data(), kept, p);
}

std::vector<Candidate> sampler_candidates_sorted(const int64_t* tokens,
                                                 const float* logits,
                                                 int64_t n,
                                                 const SamplingParams& p) {
    if (p.temperature <= 0)
        return {{tokens[0], 1.0}};
    const int64_t kept = p.top_k > 0 ? std::min<int64_t>(p.top_k, n) : n;
    std::vector<Candidate> c(static_cast<size_t>(kept));
    const double mx = static_cast<double>(logits[0]);
    double sum = 0;
    for (int64_t i = 0; i < kept; ++i) {
        double w = std::exp((static_cast<double>(logits[i]) - mx) / p.temperature);
        c[i] = {tokens[i], w};
        sum += w;
    }
    if (p.top_p < 1) {  // shortest prefix reaching top_p of the (top-k) mass
        double cum = 0;
        int64_t m = 0;
        while (m < kept && cum < p.top_p * sum)
            cum += c[m++].prob;
        c.resize(static_cast<size_t>(std::max<int64_t>(m, 1)));
        sum = 0;
        for (const Candidate& x : c)
            sum += x.prob;
    }
    for (Candidate& x : c)
        x.prob /= sum;
    return c;
}

int64_t draw_candidate(const std::vector<Candidate>& c, float u) {
    double cum = 0;
    for (const Candidate& x : c) {
        cum += x.prob;
        if (static_cast<double>(u) < cum)
            return x.token;
    }
    return c.back().token;  // u within rounding of 1
}

int64_t sample_token(const float* logits, int64_t V, const SamplingParams& p, float u) {
    if (p.temperature <= 0)
        return argmax_token(logits, V);
    return draw_candidate(sampler_candidates(logits, V, p), u);
}

}  // namespace hymoe::runtime
