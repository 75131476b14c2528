// The continuous-batching inference engine. Requests come from a pull source (the JSONL reader
// streams them; nothing holds the whole dataset) and leave through a sink as they finish. Every
// step builds one packed forward (model/batch.h):
//   1. one decode row per running sequence that has finished its prompt,
//   2. the next prefill chunk of each sequence still in its prompt,
//   3. new requests, admitted in file order while the running set is under its share of
//      batch.max_seqs and the step's rows stay within batch.max_tokens,
// then samples the next token of every sequence whose row was its last prompt token or a decode
// row. A prefill chunk is always min(prefill_chunk, tokens left) long, and a sequence whose chunk
// does not fit this step waits for the next: chunk boundaries depend on the request alone, never
// on what else is running. Sampling draws from Philox(seed, request index, token index) (see
// runtime/sampler.h), so a request's output does not depend on batch composition either.
// Samples (a request's "n"): each is a sequence of its own (Pending::sample) with the request's
// prompt; sample j draws from Philox(job.seed ^ j·c, request index, token index), or with the
// request's seed from Philox(seed, stream j, token index), so sample 0 is the request with n = 1
// and every sample depends on (seed, its index) alone.
// A sequence finishes with "stop" when it samples eos or one of the request's stop_token_ids (the
// token is kept as its last output token), or when its output text (the tokens' bytes, through
// EngineOptions::token_bytes) comes to hold one of the request's stop strings: each new token's
// bytes are searched with the stop's length − 1 bytes before them, so a stop spanning tokens is
// found; the first stop completed wins (at one token: the one starting first), the tokens are
// kept up to the one that completed it and Finished::text_bytes cuts the text before it (vLLM's
// default). Else "length" at max_new_tokens (the request's, else the deck's; 0 = prompt only).
// Several ranks: every rank of a dp replica runs the same steps on the same requests (its tp
// ranks and pipeline stages each hold part of the model). The pipeline is micro-batched: the
// running sequences form pp lanes of ⌈max_seqs/pp⌉ at most; tick t launches a step of lane
// t mod pp, stage s runs the step launched s ticks earlier, so every stage is busy; the last
// stage turns the logits into the step's tokens and broadcasts them over pp. The dp replicas
// tick together, a replica with nothing to run joining with an empty batch, while any has work:
// their MoE layers share ep groups. MLA/DSA caches are paged (model/kv_cache.h): every lane
// has a pool of kv_pages/pp pages and preempts when it runs out (src/runtime/engine_lane.h).
// Images (model-math §8): a request's images are encoded when it is admitted, all images admitted
// in one step packed into one vision_forward, on the first stage's ranks (the tower is replicated
// on each of them; later stages never see pixels). The projected tokens stay with the sequence
// (a preempted sequence keeps them) and replace its prompt's placeholder rows, in order, in each
// prefill chunk's embeddings (model::MediaSplice); requests with and without images share steps.
// KV offload (inference.kv_cache.offload): EngineOptions::kv_store gives each lane's pool its
// store, e.g. the spill-file tier of runtime/kv_spill.h.
// GPU (EngineOptions::device): the device model makes the sequences' states and the pools' stores
// (kv_store, or its host tier host_kv_store given as EngineOptions::kv_store), runs every forward
// and encodes the images; batching, paging and sampling are the same, so the outputs are the
// CPU's up to the device's rounding. Sampling stays on the host: a step's last rows come back
// reduced to their best few tokens (model::TopLogits: greedy, top-k sampling, top logprobs) and
// whole only where the rules read the whole row (sampling without top-k, prompt logprobs).
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "hymoe/io/image.h"
#include "hymoe/io/requests.h"
#include "hymoe/model/device_model.h"
#include "hymoe/model/kv_cache.h"
#include "hymoe/model/model.h"
#include "hymoe/parallel/comms.h"
#include "hymoe/runtime/job.h"
#include "hymoe/runtime/sampler.h"

namespace hymoe::runtime {

enum class Finish : int32_t { stop = 0, length = 1 };
const char* to_string(Finish f);

struct EngineOptions {
    int max_seqs = 64, max_tokens = 8192, prefill_chunk = 2048;
    int max_new_tokens = 64;      // for requests that do not give their own
    int page_tokens = 64;         // KV cache page size (inference.kv_cache.page_tokens)
    DType kv_dtype = DType::f32;  // KV rows (inference.kv_cache.dtype; a device's are f32)
    int64_t kv_pages = std::numeric_limits<int32_t>::max();  // per dp replica, split over lanes
    model::KvStoreFactory kv_store;  // where each lane's pages live; empty: all in memory (with
                                     //   a device: DeviceModel::kv_store, on the device)
    SamplingParams sampling;
    uint64_t seed = 0;
    int64_t eos_id = -1;                                     // −1: no stop token
    std::function<const std::string&(int64_t)> token_bytes;  // a token's bytes (stop strings)
    bool prompt_logprobs = false;  // teacher-forced logprob of every prompt token after the first
    int top_logprobs = 0;          // the N most likely tokens and logprobs at each output token
    double progress_every_s = 5;   // ≤ 0: no progress lines
    model::ForwardStats* layer_stats = nullptr;  // per-layer timings summed over steps, if given
    // With a device: layer_stats only on every Nth step (timing synchronises at each layer and
    // keeps a step off the decode graphs), so the timings and expert loads are those steps'.
    int device_stats_every = 16;
    // Each output token as it is drawn (request index, sample, token), on every rank alike.
    std::function<void(int64_t, int, int64_t)> on_token;
    std::function<bool()> stop;       // polled every tick on every rank: true on any rank ends
                                      //   the run at that tick boundary (EngineStats::stopped)
    int64_t rebalance_every = 0;      // call rebalance() after every this many ticks (0: never);
    std::function<void()> rebalance;  // collective: every rank calls it at the same tick
    std::map<std::string, int> adapter_ids;  // LoRA adapter name → id (model/lora.h); a request
                                             //   with adapter "" runs on the base model
    int image_pool = 1;  // vision feature pooling (inference.images.pool; model/vision.h)
    // Prefix caching (inference.prefix_cache; runtime/prefix_cache.h): each lane keeps up to
    // prefix_cache_bytes of KDA snapshots (and their prompts' shared pages in its pool); 0: off.
    // Not with prompt_logprobs (every prompt token's logits are needed); with a device, its KDA
    // snapshots are host copies of the device's states (DeviceModel::save_kda_states).
    int64_t prefix_cache_bytes = 0;
    model::DeviceModel* device = nullptr;  // the forward on a GPU (model/device_model.h): its
                                           //   sequences, KV pages and forward replace the host
                                           //   model's, and its encoder the vision tower's
                                           //   (m still gives the config); null: the CPU
};

// A request with its index in the file (0-based over request lines, bad ones included).
struct Pending {
    int64_t index = 0;
    int sample = 0;  // 0 .. req.n − 1
    io::Request req;
    std::vector<io::Image> images;  // req.images decoded, resized and normalised
};

struct Finished {
    int64_t index = 0;
    int sample = 0;
    io::Request req;                     // id, line, adapter, prompt tokens
    std::vector<int64_t> tokens;         // [n_out] generated tokens
    std::vector<float> logprobs;         // [n_out] their log-probabilities (raw log_softmax)
    std::vector<int64_t> top_tokens;     // [n_out, N] the N most likely (N = top_logprobs)
    std::vector<float> top_logprobs;     // [n_out, N] their log-probabilities
    std::vector<float> prompt_logprobs;  // [prompt_len − 1] when asked; token t+1 given 0..t
    int64_t greedy_token = -1;           // argmax after the whole prompt
    float greedy_logprob = 0;
    Finish finish = Finish::length;
    std::string stop_string;  // the stop string that ended it ("" none)
    int64_t stop_token = -1;  // the stop_token_ids entry that ended it (−1 none; eos is none)
    int64_t text_bytes = -1;  // with a stop string: the output text is its tokens' first
                              //   text_bytes bytes (−1: all of them)
};

struct EngineStats {
    int64_t requests = 0, prompt_tokens = 0, generated_tokens = 0, steps = 0;
    int64_t rows = 0, seqs = 0;  // Σ over steps of the forward's tokens and sequences
    double seconds = 0;
    bool stopped = false;           // options.stop ended the run: unfinished requests were dropped
    int64_t preemptions = 0;        // sequences restarted when the KV pages ran out
    int64_t pages_in_use = 0;       // KV pages held after the latest step was built
    int64_t peak_pages = 0;         // the most held at once
    int64_t peak_seqs = 0;          // the most sequences running at once (their KDA states)
    int64_t kv_resident_bytes = 0;  // the lanes' stores' most KV bytes in memory, summed
    // Prefix cache: prompt tokens restored instead of prefilled (prompt_tokens counts the ones
    // prefilled), requests looked up and those that restored a prefix (a preempted request's
    // earlier admission not counted); entries stored and evicted, the most snapshot bytes held
    // at once (lanes summed) and the pages the entries hold after the run.
    int64_t cached_tokens = 0, cache_lookups = 0, cache_hits = 0;
    int64_t cache_stored = 0, cache_evicted = 0, cache_peak_bytes = 0, cache_pages = 0;
};

// Pull the next request; false when there are no more.
using RequestSource = std::function<bool(Pending&)>;
using FinishedSink = std::function<void(Finished&&)>;

// Runs every request of source to completion; sink sees each one as it finishes (in finishing
// order). progress(stats, running) is called every options.progress_every_s seconds of world
// rank 0's clock, at the same tick on every rank of the world (so it may be collective, e.g.
// sum over the dp replicas); pass it on every rank or on none.
EngineStats run_engine(
    const model::Model& m,
    const EngineOptions& options,
    const RequestSource& source,
    const FinishedSink& sink,
    const std::function<void(const EngineStats&, int64_t running)>& progress = {});

// ---- the infer job (src/runtime/engine_job.cpp) -----------------------------------------------

// Fills some of a rank's tensors from the job's weight source: model.init: random (seeded by
// job.seed) or model.weights (safetensors, each rank reading only its slices).
using WeightFill = std::function<void(const model::TensorList&)>;
WeightFill weight_fill(const Job& job, const model::ModelShard& shard);
// This rank's part of the job's model.
model::Model build_model(const Job& job, const parallel::Grid& grid);
// KV pages per dp replica: inference.kv_cache.pages, or (auto) what half of the memory this node
// has available holds at page_bytes a page, shared by the world's ranks as if on one node; the
// least over the ranks (collective), so every rank of a replica pages alike.
int64_t kv_pages(const Job& job, int64_t page_bytes, const parallel::Grid& grid);
// The same on the GPU: inference.kv_cache.pages (an error when they do not fit next to the
// weights), or (auto) the device model's budget; the least over the ranks (collective). With
// kv_cache.offload: host, the host tier's budget (DeviceModel::host_kv_page_budget): pages in
// half the node's available memory shared by the world's ranks, their two layer slots on the GPU.
int64_t device_kv_pages(const Job& job,
                        const model::DeviceModel& device,
                        int64_t page_bytes,
                        const parallel::Grid& grid);
// The settings of the model on the job's GPU: matrices in bf16 (model.dtype bf16) or fp32 (fp32,
// and fp16, which has no GEMM path of its own there), workspace for inference.batch, the arena
// job.device_memory's share of the GPU (device_arena_bytes: collective over the world).
model::DeviceModelOptions device_model_options(const Job& job);
// Streams inference.dataset through the engine into out/results.h5 (runtime/results.h), resuming
// an interrupted run of the same deck; logs progress and a three-line summary. on_gpu: the
// forward runs on this rank's GPU (runtime/device_choice.h decided it). Returns the exit code.
int run_infer(const Job& job, const parallel::Grid& grid, bool on_gpu = false);

}  // namespace hymoe::runtime
