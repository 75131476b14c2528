// The infer job: this rank's part of the model (random or read slice by slice), the request
// stream (bad lines skipped or fatal per inference.on_bad_request; this array shard's requests
// only; those an interrupted run finished skipped; the rest dealt to the dp replicas by token
// count), the KV page budget (pages: auto), the engine with clean stops (signals, max_hours) and
// expert rebalancing, the results journal, progress lines, the closing summary (summed over the
// replicas) and the profile and memory reports.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <limits>
#include <optional>

#include "hymoe/backend/ops.h"
#include "hymoe/core/error.h"
#include "hymoe/core/log.h"
#include "hymoe/core/sha256.h"
#include "hymoe/core/stop.h"
#include "hymoe/core/timer.h"
#include "hymoe/io/requests.h"
#include "hymoe/io/safetensors.h"
#include "hymoe/runtime/engine.h"
#include "hymoe/runtime/memory.h"
#include "hymoe/runtime/profile.h"
#include "hymoe/runtime/rebalance.h"
#include "hymoe/runtime/results.h"

namespace hymoe::runtime {

WeightFill weight_fill(const Job& job, const model::ModelShard& shard) {
    if (job.deck.model.init_random)
        return [&job, shard](const model::TensorList& list) {
            model::init_tensors_random(list, shard, job.deck.job.seed);
        };
    // each rank reads only its part: the rows or columns of its slice out of the memory map
    auto folder = std::make_shared<io::SafetensorsFolder>(job.deck.model.weights);
    auto read = [&job, folder](
                    const std::string& name, const model::TensorPart& part, Tensor& dest) {
        if (part.dim < 0)
            return folder->read(name, dest);
        const Shape& stored = folder->info(name).shape;
        if (part.dim >= static_cast<int>(stored.size()) || stored[part.dim] != part.full)
            HYMOE_FAIL_ONE(Exit::bad_input,
                           job.deck.model.weights,
                           ": ",
                           name,
                           " is ",
                           shape_string(stored),
                           " but the config gives dim ",
                           part.dim,
                           " a length of ",
                           part.full);
        folder->read_slice(name, part.dim, part.begin, dest);
    };
    return [shard, read](const model::TensorList& list) { model::load_tensors(list, shard, read); };
}

model::Model build_model(const Job& job, const parallel::Grid& grid) {
    model::Model m = model::make_model(job.model, grid);
    weight_fill(job, m.shard)(model::model_tensors(m));
    return m;
}

namespace {

// KV pages per dp replica: inference.kv_cache.pages, or (auto) what half of the memory this node
// has available holds at this rank's page size, shared by the world's ranks as if on one node;
// the smallest over the ranks, so every rank of a replica pages alike.
int64_t kv_pages(const Job& job, int64_t page_bytes, const parallel::Grid& grid) {
    if (job.deck.inference.pages > 0)
        return job.deck.inference.pages;
    int64_t available = 0;  // bytes, from /proc/meminfo (kB)
    std::ifstream meminfo("/proc/meminfo");
    for (std::string key; meminfo >> key;) {
        int64_t kb = 0;
        meminfo >> kb;
        if (key == "MemAvailable:")
            available = kb * 1024;
        meminfo.ignore(64, '\n');
    }
    int64_t pages = available / 2 / job.layout.world() / std::max<int64_t>(page_bytes, 1);
    Tensor t{&pages, DType::i64, Device::cpu, {1}};
    comm::all_reduce(t, grid.comms.world, comm::ReduceOp::min);
    // a page id is an int32 in the block tables
    return std::clamp<int64_t>(pages, job.layout.pp, std::numeric_limits<int32_t>::max());
}

std::string fixed(double x, int digits = 1) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.*f", digits, x);
    return buf;
}

// The JSONL requests as a RequestSource: counts request lines (index), applies on_bad_request,
// skips the requests a journal already holds (their lines must match), and deals the rest to the
// dp replicas: each request goes to the replica with the fewest tokens dealt so far (prompt +
// max_new_tokens; ties to the lower replica). Every rank reads the whole file and deals alike,
// and keeps its own replica's requests.
struct Stream {
    const Job& job;
    const std::vector<DoneRequest>& done;
    std::unique_ptr<io::RequestReader> reader;
    int replica;
    std::vector<int64_t> dealt;  // [dp] tokens dealt to each replica
    int64_t index = -1, read = 0, skipped = 0, resumed = 0;
    size_t next_done = 0;

    Stream(const Job& j, const std::vector<DoneRequest>& d, int dp_rank)
        : job(j),
          done(d),
          reader(io::open_requests(j.deck.inference.dataset)),
          replica(dp_rank),
          dealt(static_cast<size_t>(j.layout.dp), 0) {}

    bool mine(const io::Request& r) {
        const auto least = std::min_element(dealt.begin(), dealt.end());
        const int64_t max_new =
            r.max_new_tokens >= 0 ? r.max_new_tokens : job.deck.inference.max_new_tokens;
        *least += static_cast<int64_t>(r.tokens.size()) + max_new;
        return least - dealt.begin() == replica;
    }

    void bad(const Error& e) {
        if (job.deck.inference.on_bad_request == "fail")
            throw e;
        log::warn(cat(e.what(), " (skipped)"));
        ++skipped;
    }
    std::string check(const io::Request& r) const {  // "" if the request can run
        for (int64_t t : r.tokens)
            if (t >= job.model.vocab_size)
                return cat("token id ",
                           t,
                           " is outside the vocabulary (",
                           job.model.vocab_size,
                           " tokens)");
        if (!r.adapter.empty())
            return "adapter '" + r.adapter + "': LoRA adapters are not available in this build yet";
        return "";
    }
    bool in_shard() const {  // array jobs: this shard's share of the request indexes
        return index % job.deck.inference.shards == job.deck.inference.shard;
    }
    bool next(Pending& p) {
        for (io::Request r;;) {
            try {
                if (!reader->next(r))
                    break;
            } catch (const Error& e) {
                ++index;
                if (in_shard())
                    bad(e);
                continue;
            }
            ++index;
            if (!in_shard())
                continue;
            if (std::string why = check(r); !why.empty()) {
                try {
                    HYMOE_FAIL(Exit::bad_input, job.deck.inference.dataset, ":", r.line, ": ", why);
                } catch (const Error& e) {
                    bad(e);
                }
                continue;
            }
            if (next_done < done.size() && done[next_done].index == index) {
                const DoneRequest& d = done[next_done];
                if (d.line != r.line || d.id != r.id ||
                    d.prompt_len != static_cast<int64_t>(r.tokens.size()))
                    break;  // reported below: the dataset changed
                ++next_done;
                ++resumed;
                continue;
            }
            if (!mine(r))
                continue;
            ++read;
            p = Pending{index, std::move(r)};
            return true;
        }
        if (next_done < done.size())
            HYMOE_FAIL(Exit::bad_input,
                       job.deck.inference.dataset,
                       " changed since the interrupted run (request ",
                       done[next_done].index,
                       " of ",
                       job.deck.job.output,
                       "/results.parts is not where it was); remove that folder to start afresh");
        return false;
    }
};

}  // namespace

int run_infer(const Job& job, const parallel::Grid& grid) {
    const deck::InferenceSection& inf = job.deck.inference;
    const double t0 = wall_seconds();
    model::Model m = build_model(job, grid);
    log::info(cat("model ready in ",
                  fixed(wall_seconds() - t0, 2),
                  " s (",
                  job.deck.model.init_random ? "random init" : job.deck.model.weights,
                  ")"));
    // a journal segment every 4 batches' worth of finished requests (or 10 s)
    const bool writer = grid.me.tp == 0 && m.shard.last_stage();  // one per dp replica
    const int top_n = static_cast<int>(std::min<int64_t>(inf.logprobs, job.model.vocab_size));
    ResultsJournal journal(
        job.deck.job.output,
        sha256_hex(job.deck.resolved_yaml),
        inf.prompt_logprobs,
        top_n,
        {grid.comms.world, grid.comms.self, writer ? grid.me.dp : -1, job.layout.dp},
        std::clamp(4 * inf.max_seqs, 8, 4096));
    Stream stream(job, journal.done(), grid.me.dp);
    ops::set_batch_invariant(inf.batch_invariant);
    EngineOptions o;
    o.max_seqs = inf.max_seqs, o.max_tokens = inf.max_tokens, o.prefill_chunk = inf.prefill_chunk;
    o.max_new_tokens = inf.max_new_tokens;
    o.page_tokens = inf.page_tokens;
    const int64_t page_bytes = model::KvPool(m.local, m.shard, o.page_tokens, 0).page_bytes();
    o.kv_pages = kv_pages(job, page_bytes, grid);
    o.sampling = {inf.temperature, inf.top_k, inf.top_p};
    o.seed = job.deck.job.seed, o.eos_id = job.model.eos_id;
    o.prompt_logprobs = inf.prompt_logprobs;
    o.top_logprobs = top_n;
    int64_t n_stop = 0, n_length = 0;
    auto sink = [&](Finished&& f) {
        ++(f.finish == Finish::stop ? n_stop : n_length);
        journal.add(std::move(f));
    };
    // this shard's requests in the file; rank 0 sees its replica, ~1/dp of the work
    const int64_t total =
        (io::count_requests(inf.dataset) + inf.shards - 1 - inf.shard) / inf.shards;
    auto progress = [&](const EngineStats& s, int64_t running) {
        const double done = static_cast<double>(s.requests) * job.layout.dp;  // estimated
        const double left = static_cast<double>(total - stream.resumed) - done;
        log::info(cat("progress: ",
                      s.requests + stream.resumed,
                      " requests done / ",
                      stream.read + stream.resumed,
                      " read / ",
                      total,
                      " in the file",
                      job.layout.dp > 1 ? " (replica 0)" : "",
                      ", ETA ",
                      done > 0 ? fixed(std::max(left, 0.0) * s.seconds / done, 0) + " s" : "?",
                      ", ",
                      fixed(s.prompt_tokens / s.seconds),
                      " prompt tokens/s, ",
                      fixed(s.generated_tokens / s.seconds),
                      " generated tokens/s, ",
                      running,
                      " running, ",
                      s.pages_in_use,
                      " of ",
                      o.kv_pages,
                      " KV pages in use"));
    };
    model::ForwardStats layer_stats;
    const bool profiling = job.deck.profile.layers || job.deck.profile.experts;
    const bool rebalancing =
        job.deck.parallel.rebalance_every > 0 && job.layout.ep > 1 &&
        count_layers(job.model, model::Ffn::dense) < static_cast<int>(job.model.layers.size());
    if (profiling || rebalancing)
        o.layer_stats = &layer_stats;
    std::optional<ExpertRebalancer> rebalance;
    if (rebalancing) {
        rebalance.emplace(job, grid, m, layer_stats, weight_fill(job, m.shard));
        o.rebalance_every = job.deck.parallel.rebalance_every;
        o.rebalance = [&] { (*rebalance)(); };
    }
    // stop cleanly on SIGUSR1/SIGTERM/SIGINT, or at 99% of job.max_hours (as GROMACS -maxh)
    const StopSignals stop_signals;
    const double max_seconds = 0.99 * 3600 * job.deck.job.max_hours;
    o.stop = [&] {
        return stop_signal() != 0 || (max_seconds > 0 && wall_seconds() - t0 >= max_seconds);
    };
    EngineStats s = run_engine(
        m, o, [&](Pending& p) { return stream.next(p); }, sink, progress);
    if (s.stopped) {
        journal.flush();
        int64_t sig = stop_signal();  // the signal may have reached some ranks only
        Tensor any{&sig, DType::i64, Device::cpu, {1}};
        comm::all_reduce(any, grid.comms.world, comm::ReduceOp::max);
        log::info(cat("stopped by ",
                      sig ? signal_name(static_cast<int>(sig)) : "job.max_hours",
                      " after ",
                      fixed(wall_seconds() - t0, 1),
                      " s: finished requests are saved in ",
                      job.deck.job.output,
                      "/results.parts; rerun the same deck to resume (exit 75)"));
        return static_cast<int>(Exit::stopped);
    }
    if (job.layout.dp > 1) {  // the summary counts every replica
        int64_t sums[] = {s.requests,
                          s.prompt_tokens,
                          s.generated_tokens,
                          s.rows,
                          s.seqs,
                          n_stop,
                          n_length,
                          stream.read,
                          s.preemptions};
        Tensor t{sums, DType::i64, Device::cpu, {9}};
        comm::all_reduce(t, grid.comms.dp);
        s.requests = sums[0], s.prompt_tokens = sums[1], s.generated_tokens = sums[2];
        s.rows = sums[3], s.seqs = sums[4], n_stop = sums[5], n_length = sums[6];
        stream.read = sums[7], s.preemptions = sums[8];
    }
    const int64_t n =
        journal.finish({&job.deck, job.layout, model::describe(job.model), log::utc_timestamp()});
    const double secs = std::max(s.seconds, 1e-9);
    if (inf.prompt_logprobs)
        log::info(cat("scored ",
                      n,
                      " requests (",
                      s.prompt_tokens,
                      " tokens, ",
                      stream.skipped,
                      " skipped) in ",
                      fixed(s.seconds, 3),
                      " s: ",
                      fixed(s.prompt_tokens / secs),
                      " tokens/s"));
    log::info(cat("done: ",
                  n,
                  " requests (",
                  s.requests,
                  " run, ",
                  stream.resumed,
                  " resumed, ",
                  stream.skipped,
                  " skipped); finished by stop ",
                  n_stop,
                  ", by length ",
                  n_length));
    log::info(cat("tokens: ",
                  s.prompt_tokens,
                  " prompt (",
                  fixed(s.prompt_tokens / secs),
                  "/s), ",
                  s.generated_tokens,
                  " generated (",
                  fixed(s.generated_tokens / secs),
                  "/s) in ",
                  fixed(s.seconds, 2),
                  " s"));
    const double steps = static_cast<double>(std::max<int64_t>(s.steps, 1));
    log::info(cat("batching: ",
                  s.steps,
                  " steps of ",
                  fixed(static_cast<double>(s.seqs) / steps),
                  " sequences and ",
                  fixed(static_cast<double>(s.rows) / steps),
                  " tokens on average",
                  job.layout.dp > 1 ? cat(" over the ", job.layout.dp, " dp replicas") : "",
                  " (max_seqs ",
                  o.max_seqs,
                  ", max_tokens ",
                  o.max_tokens,
                  ", prefill_chunk ",
                  o.prefill_chunk,
                  ")"));
    log::info(cat("kv cache: at most ",
                  s.peak_pages,
                  " of ",
                  o.kv_pages,
                  " pages of ",
                  o.page_tokens,
                  " tokens in use (",
                  fixed(static_cast<double>(s.peak_pages * page_bytes) / 1e6, 2),
                  " MB on rank 0), ",
                  s.preemptions,
                  " preemptions"));
    if (rebalancing)
        log::info(rebalance->summary());
    const RankMemory memory = rank_memory(job, m, s.peak_pages * page_bytes);
    log::info(memory_line(memory));
    std::string outputs = job.deck.job.output + "/results.h5, ";
    if (profiling) {
        const JobProfile prof = gather_profile(job, grid, layer_stats);
        log::info(profile_table(job.model, prof));
        write_profile(job, grid, prof, memory);
        outputs += job.deck.job.output + "/profile.h5, ";
    }
    log::info("outputs: " + outputs + job.deck.job.output + "/log");
    return 0;
}

}  // namespace hymoe::runtime
