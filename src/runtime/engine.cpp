// The continuous-batching engine (see runtime/engine.h for the step rules).
#include "hymoe/runtime/engine.h"

#include <algorithm>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include "engine_lane.h"
#include "hymoe/core/error.h"
#include "hymoe/core/rng.h"
#include "hymoe/core/timer.h"

namespace hymoe::runtime {

const char* to_string(Finish f) {
    return f == Finish::stop ? "stop" : "length";
}

namespace {

// Row r's last logits as the step's decisions read them: the whole row of the host logits, or
// its top n from the device (model::TopLogits), which the sampler's rules read alike.
struct LastRow {
    const float* row = nullptr;           // [V] the whole row, or null
    const int64_t* top_tokens = nullptr;  // [n]
    const float* top_logits = nullptr;    // [n]
    int64_t n = 0;
    double log_sum = 0;  // log Σ_j e^{x_j − top_logits[0]}

    // log_softmax at `token` (from the top: one of its n tokens), as runtime::token_logprob.
    float logprob(int64_t token, int64_t V) const {
        if (row != nullptr)
            return static_cast<float>(token_logprob(row, V, token));
        const int64_t i = std::find(top_tokens, top_tokens + n, token) - top_tokens;
        HYMOE_CHECK(i < n, "engine: token ", token, " is not among the device's top ", n);
        return static_cast<float>(static_cast<double>(top_logits[i]) -
                                  static_cast<double>(top_logits[0]) - log_sum);
    }
    int64_t greedy(int64_t V) const { return row ? argmax_token(row, V) : top_tokens[0]; }
    // The N most likely tokens and their logprobs (runtime::top_logprobs).
    void most_likely(int64_t V, int N, int64_t* tokens, float* logprobs) const {
        if (row != nullptr)
            return top_logprobs(row, V, N, tokens, logprobs);
        for (int i = 0; i < N; ++i) {
            tokens[i] = top_tokens[i];
            logprobs[i] = logprob(tokens[i], V);
        }
    }
};

// Tokens a row the device reduces a step's last rows to (model::TopLogits), or 0 when the rules
// read the whole row (sampling without top-k, penalties) or the top is too wide to gain from.
int64_t device_top_n(const EngineOptions& o, int64_t V) {
    constexpr int64_t kMaxTop = 1024;
    if (o.sampling.penalised())
        return 0;
    int64_t n = std::max<int64_t>(1, o.top_logprobs);
    if (o.sampling.temperature > 0) {
        if (o.sampling.top_k <= 0)
            return 0;
        n = std::max<int64_t>(n, o.sampling.top_k);
    }
    return n <= std::min(V, kMaxTop) ? n : 0;
}

// The deck's sampling settings with the request's own (io::Request) in their place, key by key.
SamplingParams request_sampling(const io::Request& r, const SamplingParams& deck) {
    SamplingParams p = deck;
    if (r.temperature >= 0)
        p.temperature = r.temperature;
    if (r.top_k >= 0)
        p.top_k = r.top_k;
    if (r.top_p >= 0)
        p.top_p = r.top_p;
    p.min_p = r.min_p.value_or(p.min_p);
    p.presence_penalty = r.presence_penalty.value_or(p.presence_penalty);
    p.frequency_penalty = r.frequency_penalty.value_or(p.frequency_penalty);
    p.repetition_penalty = r.repetition_penalty.value_or(p.repetition_penalty);
    return p;
}

// The token drawn from `last` as sequence s's next output, with its logprob (the raw row's). A
// request seed keys its draws alone (Philox(seed, stream = sample, token index)), so equal
// requests with equal seeds draw alike. Penalties apply to a copy of the whole row (the device
// sends it whole when the deck has them; a request's own are refused there).
std::pair<int64_t, float> draw_token(const Seq& s,
                                     const LastRow& last,
                                     int64_t V,
                                     const EngineOptions& o) {
    const io::Request& r = s.out.req;
    const SamplingParams p = request_sampling(r, o.sampling);
    const auto k = static_cast<uint32_t>(s.out.tokens.size());
    float u = 0;
    const auto sample = static_cast<uint64_t>(s.out.sample);
    if (p.temperature > 0 && r.seed >= 0) {
        u = Philox(static_cast<uint64_t>(r.seed), static_cast<uint32_t>(sample), k).uniform();
    } else if (p.temperature > 0) {
        // stream = the request index's low 32 bits; its high bits (files past 2^32 lines) and
        // the sample are folded into the key so no two sequences share a stream
        const auto index = static_cast<uint64_t>(s.out.index);
        const uint64_t key =
            o.seed ^ ((index >> 32) * 0x9E3779B97F4A7C15ull) ^ (sample * 0xD1B54A32D192ED03ull);
        u = Philox(key, static_cast<uint32_t>(index), k).uniform();
    }
    const float* row = last.row;
    std::vector<float> penalised;  // [V]
    if (p.penalised()) {
        HYMOE_CHECK(row != nullptr, "engine: penalties need the whole row of logits");
        penalised.assign(row, row + V);
        apply_penalties(penalised.data(),
                        V,
                        p,
                        r.tokens.data(),
                        static_cast<int64_t>(r.tokens.size()),
                        s.out.tokens.data(),
                        static_cast<int64_t>(s.out.tokens.size()));
        row = penalised.data();
    }
    const int64_t tok =
        row ? sample_token(row, V, p, u)
            : draw_candidate(sampler_candidates_sorted(last.top_tokens, last.top_logits, last.n, p),
                             u);
    return {tok, last.logprob(tok, V)};
}

// What a step's logits decide, computed on the last pipeline stage and broadcast to the others
// (every rank of a dp replica runs the same steps). Per row (stride 2 + N): the drawn token and
// the greedy token (rows ending a prompt) with their logprobs, then the N most likely tokens at
// the drawn one; after the rows, the prompt logprobs of every prefill row in row order
// (Logits::all steps).
struct StepOut {
    std::vector<int64_t> ints;  // [n_rows, 2 + N] drawn, greedy (−1 where none), top N
    std::vector<float> floats;  // [n_rows, 2 + N] their logprobs, then the prompt logprobs
};

int64_t stride_of(const EngineOptions& o) {
    return 2 + o.top_logprobs;
}

// From the step's logits, or from `top` when the device reduced its last rows.
StepOut step_out(const std::vector<Row>& rows,
                 const model::SeqBatch& batch,
                 const Buffer& logits,
                 const model::TopLogits* top,
                 bool all_rows,
                 int64_t V,
                 const EngineOptions& o) {
    const int64_t S = stride_of(o);
    StepOut out;
    out.ints.assign(S * rows.size(), -1);
    out.floats.assign(S * rows.size(), 0.0f);
    const float* base = top ? nullptr : logits.ptr<float>();  // [n_tok or n_seq, V]
    for (size_t r = 0; r < rows.size(); ++r) {
        const Seq& s = *rows[r].seq;
        LastRow last;
        if (top) {
            last = {nullptr,
                    top->tokens.data() + r * top->n,
                    top->logits.data() + r * top->n,
                    top->n,
                    top->log_sum[r]};
        } else {
            last.row = base + (all_rows ? batch.offsets[r + 1] - 1 : static_cast<int64_t>(r)) * V;
        }
        const int64_t begin = batch.offsets[r];
        for (int64_t t = 0; all_rows && !s.decoding() && t < rows[r].n; ++t) {
            const int64_t p = s.n_prefilled + t;  // token p+1 given 0..p
            if (p + 1 < s.prompt_len())
                out.floats.push_back(static_cast<float>(
                    token_logprob(base + (begin + t) * V, V, s.out.req.tokens[p + 1])));
        }
        if (!s.decoding() && s.n_prefilled + rows[r].n < s.prompt_len())
            continue;  // mid-prompt: no token yet
        int64_t* ints = out.ints.data() + S * r;
        float* floats = out.floats.data() + S * r;
        std::tie(ints[0], floats[0]) = draw_token(s, last, V, o);
        if (!s.decoding()) {
            ints[1] = last.greedy(V);
            floats[1] = last.logprob(ints[1], V);
        }
        if (o.top_logprobs > 0)
            last.most_likely(V, o.top_logprobs, ints + 2, floats + 2);
    }
    return out;
}

// Adds tok's bytes to s's text; true (with the stop and where the text ends) when that completes
// one of the request's stop strings (runtime/engine.h).
bool hits_stop_string(Seq& s, int64_t tok, const EngineOptions& o) {
    const std::vector<std::string>& stops = s.out.req.stop;
    if (stops.empty())
        return false;
    HYMOE_CHECK(o.token_bytes != nullptr, "engine: stop strings without the tokens' bytes");
    const size_t before = s.text.size();
    s.text += o.token_bytes(tok);
    size_t best = std::string::npos;
    for (const std::string& stop : stops) {
        const size_t from = before >= stop.size() - 1 ? before - (stop.size() - 1) : 0;
        const size_t at = s.text.find(stop, from);
        if (at < best) {
            best = at;
            s.out.stop_string = stop;
        }
    }
    if (best == std::string::npos)
        return false;
    s.out.text_bytes = static_cast<int64_t>(best);
    return true;
}

// Appends row r's drawn token (with its top N) to s's output; ends s at eos, a stop token or
// string, or max_new.
void accept_row(Seq& s, const StepOut& out, size_t r, const EngineOptions& o) {
    const int64_t S = stride_of(o);
    const int64_t* ints = out.ints.data() + S * r;
    const float* floats = out.floats.data() + S * r;
    s.out.top_tokens.insert(s.out.top_tokens.end(), ints + 2, ints + S);
    s.out.top_logprobs.insert(s.out.top_logprobs.end(), floats + 2, floats + S);
    const int64_t tok = ints[0];
    s.out.tokens.push_back(tok);
    s.out.logprobs.push_back(floats[0]);
    s.next_token = tok;
    if (o.on_token)
        o.on_token(s.out.index, s.out.sample, tok);
    const std::vector<int64_t>& stop_ids = s.out.req.stop_token_ids;
    if (tok == o.eos_id) {
        s.out.finish = Finish::stop;
        s.done = true;
    } else if (std::find(stop_ids.begin(), stop_ids.end(), tok) != stop_ids.end()) {
        s.out.finish = Finish::stop;
        s.out.stop_token = tok;
        s.done = true;
    } else if (hits_stop_string(s, tok, o)) {
        s.out.finish = Finish::stop;
        s.done = true;
    } else if (static_cast<int64_t>(s.out.tokens.size()) >= s.max_new) {
        s.out.finish = Finish::length;
        s.done = true;
    }
}

// The step's outputs applied to its sequences (on every rank alike).
void apply_step(const std::vector<Row>& rows,
                const StepOut& out,
                bool all_rows,
                const EngineOptions& o,
                EngineStats& stats) {
    const int64_t S = stride_of(o);
    size_t plp = S * rows.size();  // next prompt logprob in out.floats
    for (size_t r = 0; r < rows.size(); ++r) {
        Seq& s = *rows[r].seq;
        if (s.decoding()) {
            ++stats.generated_tokens;
            accept_row(s, out, r, o);
            continue;
        }
        for (int64_t t = 0; all_rows && t < std::min(rows[r].n, s.prompt_len() - 1 - s.n_prefilled);
             ++t)
            s.out.prompt_logprobs.push_back(out.floats[plp++]);
        s.n_prefilled += rows[r].n;
        stats.prompt_tokens += rows[r].n;
        if (!s.decoding())
            continue;
        s.out.greedy_token = out.ints[S * r + 1];
        s.out.greedy_logprob = out.floats[S * r + 1];
        if (s.max_new == 0) {
            s.out.finish = Finish::length;
            s.done = true;
        } else {
            ++stats.generated_tokens;
            accept_row(s, out, r, o);
        }
    }
}

// What every rank needs to agree on at a tick: whether any dp replica still has work, and
// whether any rank was asked to stop. One all-reduce over the world (nothing on one rank).
// progress: world rank 0's clock says a progress line is due; every rank then calls the
// progress callback at the same tick, so that it may sum over the dp replicas.
struct TickVote {
    bool any_work = false, stop = false, progress = false;
};
TickVote vote(bool has_work, bool stop, bool progress_due, const model::Model& m) {
    if (m.comms == nullptr || m.comms->world.size() == 1)
        return {has_work, stop, progress_due};
    int64_t v[3] = {has_work, stop, progress_due && m.comms->world.rank() == 0};
    Tensor t{v, DType::i64, Device::cpu, {3}};
    comm::all_reduce(t, m.comms->world, comm::ReduceOp::max);
    return {v[0] != 0, v[1] != 0, v[2] != 0};
}

// The last stage's StepOut on every stage of the pipeline.
void share_step(StepOut& out, size_t n_rows, int64_t stride, const model::Model& m) {
    const comm::Comm& pp = m.comms->pp;
    const int root = m.shard.pp - 1;
    const int64_t n_floats =
        comm::broadcast_value(static_cast<int64_t>(out.floats.size()), root, pp);
    out.ints.resize(stride * n_rows);
    out.floats.resize(static_cast<size_t>(n_floats));
    Tensor ints{out.ints.data(), DType::i64, Device::cpu, {static_cast<int64_t>(out.ints.size())}};
    Tensor floats{out.floats.data(), DType::f32, Device::cpu, {n_floats}};
    comm::broadcast(ints, root, pp);
    comm::broadcast(floats, root, pp);
}

// The lane's next step. A bad request or a full page pool seen here is seen by this dp replica
// alone (the replicas read different requests): with several replicas it ends the world from
// this rank (Scope::one_rank) instead of leaving the others waiting in the next tick's vote.
Step launch(Lane& lane, RequestQueue& queue, EngineStats& stats, const model::Model& m) {
    try {
        return lane.next_step(queue, stats);
    } catch (const Error& e) {
        if (e.scope() == Scope::collective && m.comms != nullptr && m.comms->dp.size() > 1)
            throw Error(e.code(), Scope::one_rank, e.what(), e.file(), e.line());
        throw;
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
    const int pp = m.shard.pp, stage = m.shard.stage;
    const int lane_seqs = (o.max_seqs + pp - 1) / pp;  // the replica holds about max_seqs
    EngineStats stats;
    const double t0 = wall_seconds();
    double next_progress = o.progress_every_s;
    RequestQueue queue{source};
    const int64_t lane_pages = std::max<int64_t>(o.kv_pages / pp, 1);
    std::deque<Lane> lanes;  // lane l launches at ticks ≡ l (mod pp); never moved
    for (int l = 0; l < pp; ++l)
        lanes.emplace_back(m, o, l, lane_seqs, lane_pages);

    // Tick t: lane t mod pp launches a step; stage s runs the step launched at tick t − s; the
    // last stage's step is decided, broadcast over pp and applied; then the stages start passing
    // their residual streams on, non-blocking, so that no stage waits in a send while the next
    // is in the following tick's vote.
    std::deque<Step> flight;       // launched steps, oldest first, at most pp
    Buffer logits, h_out, h_sent;  // h_sent: in flight to the next stage until `sending` is done
    model::TopLogits top;          // the device's reduced last rows (last stage)
    top.n = static_cast<int>(o.device ? device_top_n(o, V) : 0);
    comm::Request sending;
    // the CPU forward's views of m's weights: made once, and again when a rebalance moves experts
    std::optional<model::ModelViews> views;
    if (o.device == nullptr)
        views = model::host_views(m);
    for (int64_t tick = 0;; ++tick) {
        flight.push_back(launch(lanes[static_cast<size_t>(tick % pp)], queue, stats, m));
        stats.pages_in_use = 0;
        for (const Lane& lane : lanes)
            stats.pages_in_use += lane.pages_in_use();
        stats.peak_pages = std::max(stats.peak_pages, stats.pages_in_use);
        int64_t n_seqs = 0;
        for (const Lane& lane : lanes)
            n_seqs += lane.running();
        stats.peak_seqs = std::max(stats.peak_seqs, n_seqs);
        bool active = !queue.exhausted();
        for (const Lane& lane : lanes)
            active = active || !lane.empty();
        const size_t n_flight = flight.size();
        const Step none;  // early ticks: nothing has reached this stage yet
        const Step& work =
            static_cast<size_t>(stage) < n_flight ? flight[n_flight - 1 - stage] : none;
        // dp replicas tick together while any has work: their MoE layers share ep groups
        const bool due = progress && o.progress_every_s > 0 && wall_seconds() - t0 >= next_progress;
        const TickVote v = vote(active, o.stop && o.stop(), due, m);
        stats.stopped = v.stop;
        if (v.stop && stage > 0 && work.batch.n_tok() > 0) {  // take what the last tick sent
            Buffer drained(DType::f32, {work.batch.n_tok(), m.cfg.hidden_size});
            comm::recv(drained.view(), m.comms->pp_prev, m.comms->pp, 0);
        }
        if (!v.any_work || v.stop)
            break;
        model::ForwardOptions fo;
        fo.logits = work.all_rows ? model::Logits::all : model::Logits::last;
        fo.stats = o.device == nullptr || tick % std::max(o.device_stats_every, 1) == 0
                       ? o.layer_stats
                       : nullptr;
        fo.stage_out = &h_out;
        fo.media = &work.media;
        const bool reduced = top.n > 0 && !work.all_rows;
        if (o.device)
            o.device->forward(
                work.tokens, work.batch, work.states, logits, fo, reduced ? &top : nullptr);
        else
            model::forward({m, m.ctx, *views}, work.tokens, work.batch, work.states, logits, fo);
        if (n_flight == static_cast<size_t>(pp)) {  // the oldest step leaves the last stage
            Step& done = flight.front();
            StepOut out;
            if (m.shard.last_stage())
                out = step_out(
                    done.rows, done.batch, logits, reduced ? &top : nullptr, done.all_rows, V, o);
            if (pp > 1)
                share_step(out, done.rows.size(), stride_of(o), m);
            apply_step(done.rows, out, done.all_rows, o, stats);
            if (!done.rows.empty())
                ++stats.steps;
            stats.rows += done.batch.n_tok(), stats.seqs += done.batch.n_seq();
            lanes[static_cast<size_t>(done.lane)].retire(sink, stats);
            flight.pop_front();
        }
        sending.wait();  // the previous tick's residual stream has left: its buffer is free
        std::swap(h_out, h_sent);
        sending = model::send_to_next_stage(m, h_sent);
        if (o.rebalance && o.rebalance_every > 0 && (tick + 1) % o.rebalance_every == 0) {
            o.rebalance();
            if (views)
                views = model::host_views(m);
        }
        stats.seconds = wall_seconds() - t0;
        if (v.progress && progress) {
            int64_t n_running = 0;
            for (const Lane& lane : lanes)
                n_running += lane.running();
            progress(stats, n_running);
            next_progress = stats.seconds + o.progress_every_s;
        }
    }
    sending.wait();
    stats.seconds = wall_seconds() - t0;
    for (const Lane& lane : lanes) {
        stats.kv_resident_bytes += lane.kv_resident_bytes();
        const PrefixCacheStats c = lane.cache_stats();
        stats.cache_stored += c.stored, stats.cache_evicted += c.evicted;
        stats.cache_peak_bytes += c.peak_bytes, stats.cache_pages += c.pages;
    }
    return stats;
}

}  // namespace hymoe::runtime
