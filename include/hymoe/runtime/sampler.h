// Token sampling for generation: penalties, greedy (temperature 0), temperature, min-p, top-k and
// top-p over one row of logits, in vLLM's order. A draw is a pure function of (logits, params, u)
// where u is the one uniform the caller takes from Philox(job.seed, stream = request index in the
// file, subkey = generated-token index), so a request's tokens never depend on which other requests
// share its batch. Rules, fixed so every backend and batch agrees:
//   - penalties first (apply_penalties, on a copy of the row; they also steer greedy): for every
//     token seen in the prompt or the output so far a positive logit is divided by
//     repetition_penalty and a negative one multiplied (vLLM, HF); then each token's logit loses
//     frequency_penalty × (its count in the output) + presence_penalty × (1 if in the output).
//   - greedy: argmax; ties go to the smallest token id.
//   - otherwise candidates are ordered by (logit descending, id ascending); top_k > 0 keeps the
//     first k; each kept token weighs w = e^{(x − x_max)/T} (in double), its probability over the
//     whole row's maximum; min_p > 0 drops the tokens with w < min_p (vLLM: p < min_p · p_max,
//     after the temperature); top_p < 1 keeps the shortest prefix of what is left whose weight
//     reaches top_p of its sum (at least one token); the kept weights are normalised and the token
//     is the first whose cumulative sum exceeds u.
//   - the recorded logprob of a chosen token is the model's: log_softmax of the raw logits
//     (temperature 1, no filter), as vLLM and HF report it.
#pragma once

#include <cstdint>
#include <vector>

namespace hymoe::runtime {

struct SamplingParams {
    double temperature = 0;                              // 0 = greedy
    int top_k = 0;                                       // 0 = no top-k filter
    double top_p = 1;                                    // 1 = no nucleus filter
    double min_p = 0;                                    // 0 = no min-p filter
    double presence_penalty = 0, frequency_penalty = 0;  // 0 = none
    double repetition_penalty = 1;                       // 1 = none
    bool penalised() const {
        return presence_penalty != 0 || frequency_penalty != 0 || repetition_penalty != 1;
    }
};

struct Candidate {
    int64_t token;
    double prob;  // renormalised over the kept candidates
};

// The kept candidates in draw order (see the rules above); for greedy, the argmax with prob 1.
// logits [V]
std::vector<Candidate> sampler_candidates(const float* logits, int64_t V, const SamplingParams& p);

// The same from a row's n best tokens already in candidate order (logit descending, id ascending)
// with their logits, tokens [n] and logits [n]: equal to sampler_candidates on the whole row when
// n ≥ 1 for greedy and n ≥ top_k > 0 otherwise (what a device sends instead of the row).
std::vector<Candidate> sampler_candidates_sorted(const int64_t* tokens,
                                                 const float* logits,
                                                 int64_t n,
                                                 const SamplingParams& p);

// The penalties of p on a row, in place (float, as the row): prompt [n_prompt] and output
// [n_out] the tokens seen so far. logits [V]
void apply_penalties(float* logits,
                     int64_t V,
                     const SamplingParams& p,
                     const int64_t* prompt,
                     int64_t n_prompt,
                     const int64_t* output,
                     int64_t n_out);

// The first candidate whose cumulative probability exceeds u in [0, 1).
int64_t draw_candidate(const std::vector<Candidate>& c, float u);

// The token for uniform u in [0, 1). logits [V]
int64_t sample_token(const float* logits, int64_t V, const SamplingParams& p, float u);

// log_softmax(logits)[token], in double. logits [V]
double token_logprob(const float* logits, int64_t V, int64_t token);

// argmax with ties to the smallest id. logits [V]
int64_t argmax_token(const float* logits, int64_t V);

// The n most likely tokens (logit descending, ties to the smaller id) and their log_softmax, in
// tokens [n] and logprobs [n]. logits [V], n ≤ V.
void top_logprobs(const float* logits, int64_t V, int n, int64_t* tokens, float* logprobs);

}  // namespace hymoe::runtime
