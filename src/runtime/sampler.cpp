// Penalties and greedy / temperature / min-p / top-k / top-p sampling (see runtime/sampler.h for
// the rules).
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
    }
    if (p.min_p > 0)  // w is p / p_max, falling along c: the kept tokens are a prefix
        c.resize(static_cast<size_t>(
            std::partition_point(
                c.begin(), c.end(), [&](const Candidate& x) { return x.prob >= p.min_p; }) -
            c.begin()));
    for (const Candidate& x : c)
        sum += x.prob;
    if (p.top_p < 1) {  // shortest prefix reaching top_p of the (top-k) mass
        double cum = 0;
        int64_t m = 0;
        while (m < static_cast<int64_t>(c.size()) && cum < p.top_p * sum)
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

void apply_penalties(float* logits,
                     int64_t V,
                     const SamplingParams& p,
                     const int64_t* prompt,
                     int64_t n_prompt,
                     const int64_t* output,
                     int64_t n_out) {
    std::vector<int64_t> out(output, output + n_out);  // sorted: runs of equal ids count them
    std::sort(out.begin(), out.end());
    if (p.repetition_penalty != 1) {
        std::vector<int64_t> seen(prompt, prompt + n_prompt);
        seen.insert(seen.end(), out.begin(), out.end());
        std::sort(seen.begin(), seen.end());
        seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
        const auto r = static_cast<float>(p.repetition_penalty);
        for (int64_t t : seen)
            if (t >= 0 && t < V)
                logits[t] = logits[t] > 0 ? logits[t] / r : logits[t] * r;
    }
    const auto f = static_cast<float>(p.frequency_penalty);
    const auto pres = static_cast<float>(p.presence_penalty);
    for (size_t i = 0; i < out.size();) {
        size_t j = i;
        while (j < out.size() && out[j] == out[i])
            ++j;
        if (out[i] >= 0 && out[i] < V) {  // two steps, as vLLM
            logits[out[i]] -= f * static_cast<float>(j - i);
            logits[out[i]] -= pres;
        }
        i = j;
    }
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
