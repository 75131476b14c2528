// The continuous-batching engine (see runtime/engine.h for the step rules).
#include "hymoe/runtime/engine.h"

#include <algorithm>
#include <deque>
#include <memory>
#include <tuple>
#include <utility>

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

// The token drawn from logits row `logits` [V] as sequence s's next output, with its logprob.
std::pair<int64_t, float> draw_token(const Seq& s,
                                     const float* logits,
                                     int64_t V,
                                     const EngineOptions& o) {
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
    return {tok, static_cast<float>(token_logprob(logits, V, tok))};
}

// Appends tok to s's output; ends s at eos or max_new.
void accept_token(Seq& s, int64_t tok, float logprob, const EngineOptions& o) {
    s.out.tokens.push_back(tok);
    s.out.logprobs.push_back(logprob);
    s.next_token = tok;
    if (tok == o.eos_id) {
        s.out.finish = Finish::stop;
        s.done = true;
    } else if (static_cast<int64_t>(s.out.tokens.size()) >= s.max_new) {
        s.out.finish = Finish::length;
        s.done = true;
    }
}

// What a step's logits decide, computed on the last pipeline stage and broadcast to the others
// (every rank of a dp replica runs the same steps). Per row: the drawn token and the greedy
// token (rows ending a prompt) with their logprobs; then the prompt logprobs of every prefill row
// in row order (Logits::all steps).
struct StepOut {
    std::vector<int64_t> ints;  // [n_rows, 2] drawn token, greedy token (−1 where none)
    std::vector<float> floats;  // [n_rows, 2] their logprobs, then the prompt logprobs
};

StepOut step_out(const std::vector<Row>& rows,
                 const model::SeqBatch& batch,
                 const Buffer& logits,
                 bool all_rows,
                 int64_t V,
                 const EngineOptions& o) {
    StepOut out;
    out.ints.assign(2 * rows.size(), -1);
    out.floats.assign(2 * rows.size(), 0.0f);
    const float* base = logits.ptr<float>();  // [n_tok or n_seq, V]
    for (size_t r = 0; r < rows.size(); ++r) {
        const Seq& s = *rows[r].seq;
        const float* last =
            base + (all_rows ? batch.offsets[r + 1] - 1 : static_cast<int64_t>(r)) * V;
        const int64_t begin = batch.offsets[r];
        for (int64_t t = 0; all_rows && !s.decoding() && t < rows[r].n; ++t) {
            const int64_t p = s.n_prefilled + t;  // token p+1 given 0..p
            if (p + 1 < s.prompt_len())
                out.floats.push_back(static_cast<float>(
                    token_logprob(base + (begin + t) * V, V, s.out.req.tokens[p + 1])));
        }
        if (!s.decoding() && s.n_prefilled + rows[r].n < s.prompt_len())
            continue;  // mid-prompt: no token yet
        std::tie(out.ints[2 * r], out.floats[2 * r]) = draw_token(s, last, V, o);
        if (!s.decoding()) {
            out.ints[2 * r + 1] = argmax_token(last, V);
            out.floats[2 * r + 1] = static_cast<float>(token_logprob(last, V, out.ints[2 * r + 1]));
        }
    }
    return out;
}

// The step's outputs applied to its sequences (on every rank alike).
void apply_step(const std::vector<Row>& rows,
                const StepOut& out,
                bool all_rows,
                const EngineOptions& o,
                EngineStats& stats) {
    size_t plp = 2 * rows.size();  // next prompt logprob in out.floats
    for (size_t r = 0; r < rows.size(); ++r) {
        Seq& s = *rows[r].seq;
        const int64_t tok = out.ints[2 * r];
        const float lp = out.floats[2 * r];
        if (s.decoding()) {
            ++stats.generated_tokens;
            accept_token(s, tok, lp, o);
            continue;
        }
        for (int64_t t = 0; all_rows && t < std::min(rows[r].n, s.prompt_len() - 1 - s.n_prefilled);
             ++t)
            s.out.prompt_logprobs.push_back(out.floats[plp++]);
        s.n_prefilled += rows[r].n;
        stats.prompt_tokens += rows[r].n;
        if (!s.decoding())
            continue;
        s.out.greedy_token = out.ints[2 * r + 1];
        s.out.greedy_logprob = out.floats[2 * r + 1];
        if (s.max_new == 0) {
            s.out.finish = Finish::length;
            s.done = true;
        } else {
            ++stats.generated_tokens;
            accept_token(s, tok, lp, o);
        }
    }
}

// What every rank needs to agree on at a tick: whether any dp replica still has work, and
// whether any rank was asked to stop. One all-reduce over the world (nothing on one rank).
struct TickVote {
    bool any_work = false, stop = false;
};
TickVote vote(bool has_work, bool stop, const model::Model& m) {
    if (m.comms == nullptr || m.comms->world.size() == 1)
        return {has_work, stop};
    int64_t v[2] = {has_work, stop};
    Tensor t{v, DType::i64, Device::cpu, {2}};
    comm::all_reduce(t, m.comms->world, comm::ReduceOp::max);
    return {v[0] != 0, v[1] != 0};
}

// The last stage's StepOut on every stage of the pipeline.
void share_step(StepOut& out, size_t n_rows, const model::Model& m) {
    const comm::Comm& pp = m.comms->pp;
    const int root = m.shard.pp - 1;
    int64_t n_floats = static_cast<int64_t>(out.floats.size());
    Tensor count{&n_floats, DType::i64, Device::cpu, {1}};
    comm::broadcast(count, root, pp);
    out.ints.resize(2 * n_rows);
    out.floats.resize(static_cast<size_t>(n_floats));
    Tensor ints{out.ints.data(), DType::i64, Device::cpu, {static_cast<int64_t>(out.ints.size())}};
    Tensor floats{out.floats.data(), DType::f32, Device::cpu, {n_floats}};
    comm::broadcast(ints, root, pp);
    comm::broadcast(floats, root, pp);
}

// One forward step of a lane, in flight through the pipeline stages.
struct Step {
    int lane = 0;
    std::vector<Row> rows;
    std::vector<int64_t> tokens;  // [n_tok] packed as batch
    model::SeqBatch batch{{0}, {}};
    std::vector<model::SequenceState*> states;  // [n_seq]
    bool all_rows = false;                      // logits of every row (prompt logprobs)
};

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
    const int pp = m.shard.pp, stage = m.shard.stage;
    const int lane_seqs = (o.max_seqs + pp - 1) / pp;  // the replica holds about max_seqs
    EngineStats stats;
    const double t0 = wall_seconds();
    double next_progress = o.progress_every_s;
    // one running set per lane, in admission order; lane l launches at ticks ≡ l (mod pp)
    std::vector<std::vector<std::unique_ptr<Seq>>> lanes(static_cast<size_t>(pp));
    Pending peeked;
    bool have_peek = false, exhausted = false;
    auto peek = [&] {
        if (!have_peek && !exhausted)
            exhausted = !(have_peek = source(peeked));
        return have_peek;
    };
    // The lane's next step: decode rows, prefill chunks, then new requests (see engine.h).
    auto build_step = [&](int lane) {
        std::vector<std::unique_ptr<Seq>>& running = lanes[static_cast<size_t>(lane)];
        Step st;
        st.lane = lane;
        int64_t budget = o.max_tokens;
        bool any_prefill = false;
        auto add = [&](Seq& s, int64_t n) {
            st.batch.pos0.push_back(s.state.n_tokens);
            if (s.decoding()) {
                st.tokens.push_back(s.next_token);
            } else {
                const auto* p = s.out.req.tokens.data() + s.n_prefilled;
                st.tokens.insert(st.tokens.end(), p, p + n);
                any_prefill = true;
            }
            st.batch.offsets.push_back(static_cast<int64_t>(st.tokens.size()));
            st.states.push_back(&s.state);
            st.rows.push_back({&s, n});
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
        while (static_cast<int>(running.size()) < lane_seqs && budget > 0 && peek()) {
            const int64_t n =
                std::min<int64_t>(o.prefill_chunk, static_cast<int64_t>(peeked.req.tokens.size()));
            if (n > budget)
                break;
            auto s = std::make_unique<Seq>();  // 3. admit a new request
            s->out.index = peeked.index;
            s->out.req = std::move(peeked.req);
            s->max_new =
                s->out.req.max_new_tokens >= 0 ? s->out.req.max_new_tokens : o.max_new_tokens;
            s->state = model::make_sequence_state(m);
            have_peek = false;
            running.push_back(std::move(s));
            add(*running.back(), n);
        }
        HYMOE_CHECK(!st.rows.empty() || running.empty(),
                    "engine: no row fits a step of ",
                    o.max_tokens,
                    " tokens");
        st.all_rows = o.prompt_logprobs && any_prefill;
        return st;
    };

    // Tick t: lane t mod pp launches a step; stage s runs the step launched at tick t − s; the
    // last stage's step is decided, broadcast over pp and applied; then the stages pass their
    // residual streams on (after the broadcast, so no send waits on a stage inside it).
    std::deque<Step> flight;  // launched steps, oldest first, at most pp
    Buffer logits, h_out;
    for (int64_t tick = 0;; ++tick) {
        flight.push_back(build_step(static_cast<int>(tick % pp)));
        bool active = !exhausted;
        for (const auto& lane : lanes)
            active = active || !lane.empty();
        // dp replicas tick together while any has work: their MoE layers share ep groups
        const TickVote v = vote(active, o.stop && o.stop(), m);
        stats.stopped = v.stop;
        if (!v.any_work || v.stop)
            break;
        const size_t n_flight = flight.size();
        const Step none;  // early ticks: nothing has reached this stage yet
        const Step& work =
            static_cast<size_t>(stage) < n_flight ? flight[n_flight - 1 - stage] : none;
        model::ForwardOptions fo;
        fo.logits = work.all_rows ? model::Logits::all : model::Logits::last;
        fo.stats = o.layer_stats;
        fo.stage_out = &h_out;
        model::forward(m, work.tokens, work.batch, work.states, logits, fo);
        if (n_flight == static_cast<size_t>(pp)) {  // the oldest step leaves the last stage
            Step& done = flight.front();
            StepOut out;
            if (m.shard.last_stage())
                out = step_out(done.rows, done.batch, logits, done.all_rows, V, o);
            if (pp > 1)
                share_step(out, done.rows.size(), m);
            apply_step(done.rows, out, done.all_rows, o, stats);
            if (!done.rows.empty())
                ++stats.steps;
            stats.rows += done.batch.n_tok(), stats.seqs += done.batch.n_seq();
            auto& running = lanes[static_cast<size_t>(done.lane)];
            for (auto& s : running) {  // finished sequences leave, in admission order
                if (s->done) {
                    ++stats.requests;
                    sink(std::move(s->out));
                }
            }
            std::erase_if(running, [](const std::unique_ptr<Seq>& s) { return s->done; });
            flight.pop_front();
        }
        model::send_to_next_stage(m, h_out);
        if (o.rebalance && o.rebalance_every > 0 && (tick + 1) % o.rebalance_every == 0)
            o.rebalance();
        stats.seconds = wall_seconds() - t0;
        if (progress && o.progress_every_s > 0 && stats.seconds >= next_progress) {
            int64_t n_running = 0;
            for (const auto& lane : lanes)
                n_running += static_cast<int64_t>(lane.size());
            progress(stats, n_running);
            next_progress = stats.seconds + o.progress_every_s;
        }
    }
    stats.seconds = wall_seconds() - t0;
    return stats;
}

}  // namespace hymoe::runtime
