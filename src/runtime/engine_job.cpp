// The infer job: the model (infer_setup.cpp; on the GPU, model/device_model.h), the request stream
// (request_stream.h), the engine with clean stops (signals, max_hours) and expert rebalancing, the
// results journal, progress lines, the closing summary (summed over the replicas) and the profile
// and memory reports.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <numeric>
#include <optional>

#include "hymoe/backend/ops.h"
#include "hymoe/core/error.h"
#include "hymoe/core/log.h"
#include "hymoe/core/stop.h"
#include "hymoe/core/timer.h"
#include "hymoe/deck/chat_check.h"
#include "hymoe/io/h5.h"
#include "hymoe/io/requests.h"
#include "hymoe/parallel/mpi_env.h"
#include "hymoe/runtime/engine.h"
#include "hymoe/runtime/kv_spill.h"
#include "hymoe/runtime/lora_adapters.h"
#include "hymoe/runtime/memory.h"
#include "hymoe/runtime/profile.h"
#include "hymoe/runtime/rebalance.h"
#include "hymoe/runtime/rerun.h"
#include "hymoe/runtime/results.h"
#include "hymoe/runtime/results_jsonl.h"
#include "request_stream.h"

namespace hymoe::runtime {

namespace {

std::string fixed(double x, int digits = 1) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.*f", digits, x);
    return buf;
}

// The prefix cache's hit rate, summed over the dp replicas (collective over dp). s.prompt_tokens
// counts the prompt tokens prefilled, s.cached_tokens those restored instead.
std::string prefix_cache_line(const EngineStats& s, int dp, const parallel::Grid& grid) {
    int64_t v[] = {s.prompt_tokens,
                   s.cached_tokens,
                   s.cache_lookups,
                   s.cache_hits,
                   s.cache_stored,
                   s.cache_evicted};
    if (dp > 1) {
        Tensor t{v, DType::i64, Device::cpu, {6}};
        comm::all_reduce(t, grid.comms.dp);
    }
    const auto [computed, reused, lookups, hits, stored, evicted] = v;
    const int64_t requested = computed + reused;
    return cat("prefix cache: ",
               requested,
               " prompt tokens, ",
               computed,
               " prefilled, ",
               reused,
               " restored (hit rate ",
               fixed(100.0 * static_cast<double>(reused) /
                         static_cast<double>(std::max<int64_t>(requested, 1)),
                     1),
               "%); ",
               hits,
               " of ",
               lookups,
               " requests hit; ",
               stored,
               " prefixes stored, ",
               evicted,
               " evicted; at most ",
               fixed(static_cast<double>(s.cache_peak_bytes) / 1e6, 2),
               " MB of KDA snapshots and ",
               s.cache_pages,
               " KV pages held at the end on rank 0");
}

}  // namespace

int run_infer(const Job& job, const parallel::Grid& grid, bool on_gpu) {
    const deck::InferenceSection& inf = job.deck.inference;
    const double t0 = wall_seconds();
    model::Model m = build_model(job, grid);
    log::info(cat("model ready in ",
                  fixed(wall_seconds() - t0, 2),
                  " s (",
                  job.deck.model.init_random ? "random init" : job.deck.model.weights,
                  ")"));
    std::unique_ptr<model::DeviceModel> device;  // the forward on this rank's GPU
    if (on_gpu) {                                // (a build without CUDA refuses it there)
        const double t1 = wall_seconds();
        device = model::make_device_model(m, device_model_options(job));
        log::info(cat(device->describe(), ", uploaded in ", fixed(wall_seconds() - t1, 2), " s"));
    }
    // a journal segment every 4 batches' worth of finished requests (or 10 s)
    const bool writer = grid.me.tp == 0 && m.shard.last_stage();  // one per dp replica
    const int top_n = static_cast<int>(std::min<int64_t>(inf.logprobs, job.model.vocab_size));
    ResultsJournal journal(
        job.deck.job.output,
        job.deck.resolved_yaml,
        inf.prompt_logprobs,
        top_n,
        {grid.comms.world, grid.comms.self, writer ? grid.me.dp : -1, job.layout.dp},
        std::clamp(4 * inf.max_seqs, 8, 4096));
    std::optional<text::Tokenizer> tokenizer;
    if (job.deck.tokenizer.present) {
        tokenizer.emplace(
            text::load_tokenizer(job.deck.tokenizer.path, job.deck.tokenizer.pattern));
        log::info("tokenizer: " + tokenizer->describe());
        deck::check_chat_template(job.deck, *tokenizer);
        journal.set_tokenizer(&*tokenizer);
    }
    Stream stream(job, journal.done(), grid.me.dp, tokenizer ? &*tokenizer : nullptr);
    stream.on_gpu = device != nullptr;
    ops::set_batch_invariant(inf.batch_invariant);
    EngineOptions o;
    o.max_seqs = inf.max_seqs, o.max_tokens = inf.max_tokens, o.prefill_chunk = inf.prefill_chunk;
    o.max_new_tokens = inf.max_new_tokens;
    o.page_tokens = inf.page_tokens;
    // the adapters before the KV budget: on a GPU they take device memory next to the weights
    const InferAdapters adapters = load_infer_adapters(job, m);
    o.adapter_ids = adapters.ids;
    if (device && !adapters.ids.empty())
        device->set_lora_adapters(m);
    o.kv_dtype = device ? DType::f32 : inf.kv_dtype;
    if (device && inf.kv_dtype != DType::f32)
        log::info("inference.kv_cache.dtype: the GPU keeps its KV pages in fp32");
    const int64_t page_bytes =
        model::KvPool(m.local, m.shard, o.page_tokens, 0, {}, o.kv_dtype).page_bytes();
    o.kv_pages =
        device ? device_kv_pages(job, *device, page_bytes, grid) : kv_pages(job, page_bytes, grid);
    o.device = device.get();
    SpillStats spill;  // the spill files' figures, added as each lane's store goes
    const std::string spill_dir = inf.offload_path.empty() ? job.deck.job.output : inf.offload_path;
    auto slots = std::make_shared<SpillSlots>();  // one pair for the rank's lanes
    if (inf.offload == "file" && device) {        // the device's host tier over the spill file
        o.kv_store = [&](const model::KvLayout& layout) {
            return device->file_kv_store(
                layout,
                make_spill_file(
                    spill_dir, "inference.kv_cache.offload_path", spill_file_bytes(layout)));
        };
        log::info(cat("kv offload: file: ",
                      o.kv_pages,
                      " KV pages in a spill file in ",
                      spill_dir,
                      " (",
                      fixed(static_cast<double>(o.kv_pages * page_bytes) / 1e6, 2),
                      " MB, sparse); the GPU holds a step's pages of two attention layers at a "
                      "time"));
    } else if (inf.offload == "file")
        o.kv_store = [&](const model::KvLayout& layout) -> std::unique_ptr<model::KvStore> {
            return std::make_unique<SpillKvStore>(
                layout, spill_dir, "inference.kv_cache.offload_path", &spill, slots);
        };
    else if (inf.offload == "host" && device) {
        o.kv_store = [&device](const model::KvLayout& layout) {
            return device->host_kv_store(layout);
        };
        log::info(cat("kv offload: host: ",
                      o.kv_pages,
                      " KV pages in pinned host memory (",
                      fixed(static_cast<double>(o.kv_pages * page_bytes) / 1e6, 2),
                      " MB); the GPU holds a step's pages of two attention layers at a time"));
    } else if (inf.offload == "host")
        log::info("kv_cache.offload: host keeps the pages in memory on the CPU (as none)");
    o.sampling.temperature = inf.temperature, o.sampling.top_k = inf.top_k;
    o.sampling.top_p = inf.top_p, o.sampling.min_p = inf.min_p;
    o.sampling.presence_penalty = inf.presence_penalty;
    o.sampling.frequency_penalty = inf.frequency_penalty;
    o.sampling.repetition_penalty = inf.repetition_penalty;
    o.seed = job.deck.job.seed, o.eos_id = job.model.eos_id;
    if (tokenizer)
        o.token_bytes = [&tok = *tokenizer](int64_t t) -> const std::string& {
            static const std::string replacement = "\uFFFD";  // an id past the tokenizer's
            return t < tok.n_vocab() ? tok.token_bytes(static_cast<int32_t>(t)) : replacement;
        };
    // hymoe --prompt: the text of request 0's first sample, a whole character at a time, as the
    // results' output_text writes it (stop strings are not cut from the stream)
    std::optional<text::Detokenizer> streamed;
    if (job.stream_text && tokenizer && parallel::world_rank() == 0) {
        streamed.emplace(*tokenizer);
        o.on_token = [&streamed, &tok = *tokenizer](int64_t index, int sample, int64_t t) {
            if (index != 0 || sample != 0)
                return;
            const std::string s =
                t < tok.n_vocab() ? streamed->push(static_cast<int32_t>(t)) : "\uFFFD";
            std::fwrite(s.data(), 1, s.size(), stdout);
            std::fflush(stdout);
        };
    }
    o.prompt_logprobs = inf.prompt_logprobs;
    o.top_logprobs = top_n;
    o.image_pool = inf.image_pool;
    if (inf.prefix_cache && inf.prompt_logprobs)
        log::info(
            "prefix cache: not used, since inference.prompt_logprobs needs the logits of every "
            "prompt token");
    else if (inf.prefix_cache)
        o.prefix_cache_bytes = inf.prefix_cache_bytes;
    if (o.prefix_cache_bytes > 0 && !inf.batch_invariant)
        log::info(
            "prefix cache: on; results equal an uncached run's to rounding (bit for bit with "
            "inference.batch_invariant: true)");
    int64_t n_stop = 0, n_length = 0, n_finished = 0;  // samples by finish; whole requests
    auto sink = [&](Finished&& f) {
        n_finished += stream.finish_sample(f.index);
        ++(f.finish == Finish::stop ? n_stop : n_length);
        journal.add(std::move(f));
    };
    // this shard's requests in the file, counted where progress is logged (rank 0, whose replica
    // does ~1/dp of the work): the other ranks need not read the file twice
    const int64_t total =
        grid.rank == 0 ? (io::count_requests(inf.dataset) + inf.shards - 1 - inf.shard) / inf.shards
                       : 0;
    // every rank calls it at the same tick (runtime/engine.h): the figures are summed over the
    // dp replicas; before the first request of this run finishes, the ETA comes from the token
    // rate and the tokens dealt per request so far (prompt + max_new_tokens: an upper bound)
    auto progress = [&](const EngineStats& s, int64_t running) {
        int64_t sums[] = {
            n_finished, s.prompt_tokens, s.generated_tokens, running, s.pages_in_use, stream.read};
        if (job.layout.dp > 1) {
            Tensor t{sums, DType::i64, Device::cpu, {6}};
            comm::all_reduce(t, grid.comms.dp);
        }
        const auto [done, prompt, generated, n_running, pages, read] = sums;
        const double left = static_cast<double>(total - stream.resumed - done);
        const double secs = std::max(s.seconds, 1e-9);
        const double dealt = static_cast<double>(std::accumulate(
                                 stream.dealt.begin(), stream.dealt.end(), int64_t{0})) /
                             static_cast<double>(std::max<int64_t>(read, 1));
        std::string eta = "?";
        if (done > 0)
            eta = fixed(std::max(left, 0.0) * secs / static_cast<double>(done), 0) + " s";
        else if (prompt + generated > 0)
            eta = "~" + fixed(std::max(left, 0.0) * dealt * secs / (prompt + generated), 0) + " s";
        log::info(cat("progress: ",
                      done + stream.resumed,
                      " requests done / ",
                      read + stream.resumed,
                      " read / ",
                      total,
                      " in the file",
                      stream.resumed > 0 ? cat(" (", stream.resumed, " resumed)") : "",
                      job.layout.dp > 1 ? cat(" (all ", job.layout.dp, " replicas)") : "",
                      ", ETA ",
                      eta,
                      ", ",
                      fixed(static_cast<double>(prompt) / secs),
                      " prompt tokens/s, ",
                      fixed(static_cast<double>(generated) / secs),
                      " generated tokens/s, ",
                      n_running,
                      " running, ",
                      pages,
                      " of ",
                      o.kv_pages * job.layout.dp,
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
        rebalance.emplace(job, grid, m, layer_stats, weight_fill(job, m.shard), device.get());
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
    if (streamed) {
        const std::string rest = streamed->finish();
        std::fwrite(rest.data(), 1, rest.size(), stdout);
        std::fflush(stdout);
    }
    if (s.stopped) {
        journal.flush();
        const int64_t sig =  // the signal may have reached some ranks only
            comm::all_reduce_value(stop_signal(), grid.comms.world, comm::ReduceOp::max);
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
                          n_finished,
                          s.prompt_tokens,
                          s.generated_tokens,
                          s.rows,
                          s.seqs,
                          n_stop,
                          n_length,
                          stream.read,
                          s.preemptions};
        Tensor t{sums, DType::i64, Device::cpu, {10}};
        comm::all_reduce(t, grid.comms.dp);
        s.requests = sums[0], n_finished = sums[1], s.prompt_tokens = sums[2];
        s.generated_tokens = sums[3], s.rows = sums[4], s.seqs = sums[5], n_stop = sums[6];
        n_length = sums[7], stream.read = sums[8], s.preemptions = sums[9];
    }
    const int64_t n =
        journal.finish({&job.deck, job.layout, model::describe(job.model), log::utc_timestamp()});
    if (grid.rank == 0)
        write_results_jsonl(job.deck.job.output);
    if (grid.rank == 0 && stream.resumed > 0) {  // the finish counts of the whole job
        n_stop = n_length = 0;
        for (const std::string& f :
             io::H5Reader(job.deck.job.output + "/results.h5").strings("/requests/finish_reason"))
            ++(f == "stop" ? n_stop : n_length);
    }
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
    const bool samples = s.requests != n_finished;  // some request asked for n > 1
    log::info(cat("done: ",
                  samples ? cat(n_finished + stream.resumed, " requests as ", n, " samples")
                          : cat(n, " requests"),
                  " (",
                  n_finished,
                  " run, ",
                  stream.resumed,
                  " resumed, ",
                  stream.skipped,
                  " skipped); ",
                  samples ? "samples " : "",
                  "finished by stop ",
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
    if (o.prefix_cache_bytes > 0)
        log::info(prefix_cache_line(s, job.layout.dp, grid));
    if (inf.offload == "file" && !device)
        log::info(cat(
            "kv offload: file in ",
            spill_dir,
            ": at most ",
            fixed(static_cast<double>(s.kv_resident_bytes) / 1e6, 2),
            " MB of KV rows in memory (two layers of a step's pages) instead of ",
            fixed(static_cast<double>(s.peak_pages * page_bytes) / 1e6, 2),
            " MB on rank 0; spill files ",
            fixed(static_cast<double>(spill.spilled_bytes) / 1e6, 2),
            " MB used (sparse), ",
            fixed(static_cast<double>(spill.bytes_read) / 1e6, 1),
            " MB read at ",
            fixed(static_cast<double>(spill.bytes_read) / std::max(spill.read_seconds, 1e-9) / 1e9,
                  2),
            " GB/s, ",
            fixed(static_cast<double>(spill.bytes_written) / 1e6, 1),
            " MB written"));
    if (rebalancing)
        log::info(rebalance->summary());
    const RankMemory memory = rank_memory(job, m, s.peak_pages * page_bytes, s.kv_resident_bytes);
    log::info(memory_line(memory));
    std::string outputs =
        job.deck.job.output + "/results.h5, " + job.deck.job.output + "/results.jsonl, ";
    if (profiling) {
        // the references after the run: their 256 MiB probe would otherwise count in the peak
        // resident set of the memory report above
        const JobProfile prof =
            gather_profile(job,
                           grid,
                           m,
                           layer_stats,
                           measure_peaks(),
                           layer_memory(m, o.page_tokens, o.kv_dtype, s.peak_pages, s.peak_seqs));
        log::info(profile_table(job.model, prof));
        write_profile(job, grid, prof, memory);
        outputs += job.deck.job.output + "/profile.h5, ";
    }
    log::info("outputs: " + outputs + job.deck.job.output + "/log");
    return 0;
}

}  // namespace hymoe::runtime
