// The continuous-batching engine (see runtime/engine.h for the step rules).
#include "hymoe/runtime/engine.h"

#include <algorithm>
#include <memory>

#include "hymoe/core/error.h"
#include "hymoe/core/rng.h"
#include "hymoe/core/timer.h"

namespace hymoe::runtime {

const char* to_string(Finish f) {
    return f == Finish::stop ? "stop" : "length";
}

namespace {

struct Seq {
    Finished out;             // filled as the sequence runs; out.req holds the prompt
    int64_t max_new = 0;      // tokens to generate at most
    int64_t n_prefilled = 0;  // prompt tokens already in state
    int64_t next_token = -1;  // the last sampled token, fed by the next decode row
    bool done = false;
    model::SequenceState state;
    int64_t prompt_len() const { return static_cast<int64_t>(out.req.tokens.size()); }
    bool decoding() const { return n_prefilled == prompt_len(); }
};

// One sequence's rows in the step's packed batch.
struct Row {
    Seq* seq;
    int64_t n;  // tokens in this step
};

// The token after logits row `logits` [V] for sequence s; ends s at eos or max_new.
void take_token(Seq& s, const float* logits, int64_t V, const EngineOptions& o) {
    const auto k = static_cast<uint32_t>(s.out.tokens.size());
    float u = 0;
    if (o.sampling.temperature > 0) {
        // stream = the request index's low 32 bits; its high bits (files past 2^32 lines) are
        // folded into the key so no two requests share a stream
        const auto index = static_cast<uint64_t>(s.out.index);
        const uint64_t key = o.seed ^ ((index >> 32) * 0x9E3779B97F4A7C15ull);
        u = Philox(key, static_cast<uint32_t>(index), k).uniform();
    }
    const int64_t tok = sample_token(logits, V, o.sampling, u);
    s.out.tokens.push_back(tok);
    s.out.logprobs.push_back(static_cast<float>(token_logprob(logits, V, tok)));
    s.next_token = tok;
    if (tok == o.eos_id) {
        s.out.finish = Finish::stop;
        s.done = true;
    } else if (static_cast<int64_t>(s.out.tokens.size()) >= s.max_new) {
        s.out.finish = Finish::length;
        s.done = true;
    }
}

}  // namespace

EngineStats run_engine(const model::Model& m,
                       const EngineOptions& o,
                       const RequestSource& source,
                       const FinishedSink& sink,
                       const std::function<void(const EngineStats&, int64_t)>& progress) {
    HYMOE_CHECK(o.max_seqs >= 1 && o.prefill_chunk >= 1 && o.prefill_chunk <= o.max_tokens,
                "engine: max_seqs ",
                o.max_seqs,
                ", prefill_chunk ",
                o.prefill_chunk,
                ", max_tokens ",
                o.max_tokens);
    const int64_t V = m.cfg.vocab_size;
    EngineStats stats;
    const double t0 = wall_seconds();
    double next_progress = o.progress_every_s;
    std::vector<std::unique_ptr<Seq>> running;  // in admission order
    Pending peeked;
    bool have_peek = false, exhausted = false;
    auto peek = [&] {
        if (!have_peek && !exhausted)
            exhausted = !(have_peek = source(peeked));
        return have_peek;
    };
    std::vector<int64_t> tokens;
    std::vector<Row> rows;
    std::vector<model::SequenceState*> states;
    model::SeqBatch batch;
    Buffer logits;
    for (;;) {
        tokens.clear(), rows.clear(), states.clear();
        batch.offsets.assign(1, 0), batch.pos0.clear();
        int64_t budget = o.max_tokens;
        bool any_prefill = false;
        auto add = [&](Seq& s, int64_t n) {
            batch.pos0.push_back(s.state.n_tokens);
            if (s.decoding()) {
                tokens.push_back(s.next_token);
            } else {
                const auto* p = s.out.req.tokens.data() + s.n_prefilled;
                tokens.insert(tokens.end(), p, p + n);
                any_prefill = true;
            }
            batch.offsets.push_back(static_cast<int64_t>(tokens.size()));
            states.push_back(&s.state);
            rows.push_back({&s, n});
            budget -= n;
        };
        for (auto& s : running)  // 1. decode rows
            if (s->decoding() && budget >= 1)
                add(*s, 1);
        for (auto& s : running) {  // 2. prefill chunks of sequences in their prompt
            const int64_t n = std::min<int64_t>(o.prefill_chunk, s->prompt_len() - s->n_prefilled);
            if (!s->decoding() && n <= budget)
                add(*s, n);
        }
        while (static_cast<int>(running.size()) < o.max_seqs && budget > 0 && peek()) {
            const int64_t n =
                std::min<int64_t>(o.prefill_chunk, static_cast<int64_t>(peeked.req.tokens.size()));
            if (n > budget)
                break;
            auto s = std::make_unique<Seq>();  // 3. admit a new request
            s->out.index = peeked.index;
            s->out.req = std::move(peeked.req);
            s->max_new =
                s->out.req.max_new_tokens >= 0 ? s->out.req.max_new_tokens : o.max_new_tokens;
            s->state = model::make_sequence_state(m.cfg);
            have_peek = false;
            running.push_back(std::move(s));
            add(*running.back(), n);
        }
        if (rows.empty()) {
            HYMOE_CHECK(running.empty(), "engine: no row fits a step of ", o.max_tokens, " tokens");
            break;
        }

        const bool all_rows = o.prompt_logprobs && any_prefill;
        model::ForwardOptions fo;
        fo.logits = all_rows ? model::Logits::all : model::Logits::last;
        fo.stats = o.layer_stats;
        model::forward(m, tokens, batch, states, logits, fo);
        const float* base = logits.ptr<float>();  // [n_tok or n_seq, V]
        for (size_t r = 0; r < rows.size(); ++r) {
            Seq& s = *rows[r].seq;
            const int64_t end = batch.offsets[r + 1];
            const float* last = base + (all_rows ? end - 1 : static_cast<int64_t>(r)) * V;
            if (s.decoding()) {
                ++stats.generated_tokens;
                take_token(s, last, V, o);
                continue;
            }
            const std::vector<int64_t>& prompt = s.out.req.tokens;
            const int64_t begin = batch.offsets[r];
            for (int64_t t = 0; all_rows && t < rows[r].n; ++t) {  // token p+1 given 0..p
                const int64_t p = s.n_prefilled + t;
                if (p + 1 < s.prompt_len())
                    s.out.prompt_logprobs.push_back(static_cast<float>(
                        token_logprob(base + (begin + t) * V, V, prompt[p + 1])));
            }
            s.n_prefilled += rows[r].n;
            stats.prompt_tokens += rows[r].n;
            if (!s.decoding())
                continue;
            s.out.greedy_token = argmax_token(last, V);
            s.out.greedy_logprob = static_cast<float>(token_logprob(last, V, s.out.greedy_token));
            if (s.max_new == 0) {
                s.out.finish = Finish::length;
                s.done = true;
            } else {
                ++stats.generated_tokens;
                take_token(s, last, V, o);
            }
        }
        ++stats.steps;
        stats.rows += batch.n_tok(), stats.seqs += batch.n_seq();
        for (auto& s : running) {  // finished sequences leave, in admission order
            if (s->done) {
                ++stats.requests;
                sink(std::move(s->out));
            }
        }
        std::erase_if(running, [](const std::unique_ptr<Seq>& s) { return s->done; });
        stats.seconds = wall_seconds() - t0;
        if (progress && o.progress_every_s > 0 && stats.seconds >= next_progress) {
            progress(stats, static_cast<int64_t>(running.size()));
            next_progress = stats.seconds + o.progress_every_s;
        }
    }
    stats.seconds = wall_seconds() - t0;
    return stats;
}

}  // namespace hymoe::runtime
