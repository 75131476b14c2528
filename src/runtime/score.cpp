// Prompt scoring on one rank (see runtime/score.h). results.h5 schema (README "Outputs"):
//   /requests/id [N] str, /requests/line [N], /requests/prompt_len [N],
//   /requests/logprob_offsets [N+1], /requests/prompt_logprobs [Σ(len−1)] (token t+1 given 0..t),
//   /requests/greedy_token [N], /requests/greedy_logprob [N], and /meta.
#include "hymoe/runtime/score.h"

#include <algorithm>
#include <cmath>

#include "hymoe/core/error.h"
#include "hymoe/core/log.h"
#include "hymoe/core/timer.h"
#include "hymoe/io/h5.h"
#include "hymoe/io/meta.h"
#include "hymoe/io/requests.h"
#include "hymoe/io/safetensors.h"

namespace hymoe::runtime {

model::Model build_model(const Job& job) {
    model::Model m = model::make_model(job.model);
    if (job.deck.model.init_random) {
        model::init_model_random(m, job.deck.job.seed);
        return m;
    }
    io::SafetensorsFolder folder(job.deck.model.weights);
    model::load_model_weights(
        m, [&](const std::string& name, Tensor& dest) { folder.read(name, dest); });
    return m;
}

namespace {

struct Scores {
    std::vector<std::string> id;
    std::vector<int64_t> line, prompt_len, offsets{0}, greedy_token;
    std::vector<float> logprobs, greedy_logprob;
};

// log-softmax of one row of logits at index i: x_i − logsumexp(x).
double log_prob(const float* row, int64_t n, int64_t i) {
    const float mx = *std::max_element(row, row + n);
    double sum = 0;
    for (int64_t j = 0; j < n; ++j)
        sum += std::exp(static_cast<double>(row[j] - mx));
    return static_cast<double>(row[i] - mx) - std::log(sum);
}

// Score one packed batch and append its results.
void score_batch(const model::Model& m, const std::vector<io::Request>& reqs, Scores& out) {
    model::SeqBatch batch;
    batch.offsets.push_back(0);
    std::vector<int64_t> tokens;
    for (const io::Request& r : reqs) {
        tokens.insert(tokens.end(), r.tokens.begin(), r.tokens.end());
        batch.offsets.push_back(static_cast<int64_t>(tokens.size()));
        batch.pos0.push_back(0);
    }
    std::vector<model::SequenceState> states;
    for (size_t s = 0; s < reqs.size(); ++s)
        states.push_back(model::make_sequence_state(m.cfg));
    std::vector<model::SequenceState*> ptrs;
    for (auto& s : states)
        ptrs.push_back(&s);
    Buffer logits;
    model::forward(m, tokens, batch, ptrs, logits);
    const int64_t V = m.cfg.vocab_size;
    for (size_t s = 0; s < reqs.size(); ++s) {
        const int64_t begin = batch.offsets[s], len = batch.length(static_cast<int64_t>(s));
        for (int64_t t = 0; t + 1 < len; ++t)
            out.logprobs.push_back(static_cast<float>(
                log_prob(logits.ptr<float>() + (begin + t) * V, V, tokens[begin + t + 1])));
        const float* last = logits.ptr<float>() + (begin + len - 1) * V;
        const int64_t best = std::max_element(last, last + V) - last;  // ties: the smaller id
        out.id.push_back(reqs[s].id);
        out.line.push_back(reqs[s].line);
        out.prompt_len.push_back(len);
        out.offsets.push_back(static_cast<int64_t>(out.logprobs.size()));
        out.greedy_token.push_back(best);
        out.greedy_logprob.push_back(static_cast<float>(log_prob(last, V, best)));
    }
}

template <typename T>
Tensor view_of(std::vector<T>& v, DType dtype) {
    return Tensor{v.data(), dtype, Device::cpu, {static_cast<int64_t>(v.size())}};
}

void write_results(const Job& job, const parallel::Grid& grid, Scores& s) {
    io::H5Writer file(job.deck.job.output + "/results.h5", grid.comms.world);
    io::write_meta(file, {&job.deck, job.layout, model::describe(job.model), log::utc_timestamp()});
    file.strings("/requests/id", s.id);
    file.array("/requests/line", view_of(s.line, DType::i64));
    file.array("/requests/prompt_len", view_of(s.prompt_len, DType::i64));
    file.array("/requests/logprob_offsets", view_of(s.offsets, DType::i64));
    file.array("/requests/prompt_logprobs", view_of(s.logprobs, DType::f32));
    file.array("/requests/greedy_token", view_of(s.greedy_token, DType::i64));
    file.array("/requests/greedy_logprob", view_of(s.greedy_logprob, DType::f32));
    file.commit();
}

}  // namespace

void check_scoring(const Job& job) {
    if (job.layout.world() != 1)
        HYMOE_FAIL(Exit::invalid,
                   job.deck.locate("parallel"),
                   ": prompt scoring runs on one rank in this build (tp = dp = pp = 1)");
    if (!job.deck.inference.prompt_logprobs)
        HYMOE_FAIL(Exit::invalid,
                   job.deck.locate("inference.prompt_logprobs"),
                   ": generation is not available in this build yet; set it to true to score "
                   "the prompts");
}

int run_scoring(const Job& job, const parallel::Grid& grid) {
    const deck::InferenceSection& inf = job.deck.inference;
    double t_load = 0, t_score = 0;
    model::Model m;
    {
        ScopedTimer timer(t_load);
        m = build_model(job);
    }
    log::info(cat("model ready in ",
                  t_load,
                  " s (",
                  job.deck.model.init_random ? "random init" : job.deck.model.weights,
                  ")"));
    io::RequestReader reader(inf.dataset);
    Scores scores;
    std::vector<io::Request> pending;
    int64_t pending_tokens = 0, skipped = 0, scored_tokens = 0;
    auto flush = [&] {
        if (pending.empty())
            return;
        ScopedTimer timer(t_score);
        score_batch(m, pending, scores);
        pending.clear();
        pending_tokens = 0;
    };
    for (io::Request r;;) {
        try {
            if (!reader.next(r))
                break;
        } catch (const Error& e) {
            if (inf.on_bad_request == "fail")
                throw;
            log::warn(cat(e.what(), " (skipped)"));
            ++skipped;
            continue;
        }
        const int64_t n = static_cast<int64_t>(r.tokens.size());
        for (int64_t t : r.tokens)
            if (t >= job.model.vocab_size)
                HYMOE_FAIL(Exit::bad_input,
                           inf.dataset,
                           ":",
                           r.line,
                           ": token id ",
                           t,
                           " is outside the vocabulary (",
                           job.model.vocab_size,
                           " tokens)");
        if (pending_tokens + n > inf.max_tokens || static_cast<int>(pending.size()) >= inf.max_seqs)
            flush();
        pending_tokens += n;
        scored_tokens += n;
        pending.push_back(std::move(r));
    }
    flush();
    write_results(job, grid, scores);
    log::info(cat("scored ",
                  scores.id.size(),
                  " requests (",
                  scored_tokens,
                  " tokens, ",
                  skipped,
                  " skipped) in ",
                  t_score,
                  " s: ",
                  scored_tokens / std::max(t_score, 1e-9),
                  " tokens/s; wrote ",
                  job.deck.job.output,
                  "/results.h5"));
    return 0;
}

}  // namespace hymoe::runtime
