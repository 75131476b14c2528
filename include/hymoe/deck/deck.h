// The typed job deck (DESIGN.md "Deck"). parse_deck() turns YAML text into a Deck: every key is
// checked for type and range, unknown keys are errors, defaults are filled in, and the resolved
// deck (defaults included) is kept as YAML text for the log and every HDF5 output. Paths are
// resolved against the deck's folder. The parser is pure C++ (no MPI): rank 0 reads the file,
// broadcasts its bytes, and every rank parses the same bytes into the same Deck.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "hymoe/core/types.h"
#include "hymoe/text/chat.h"

namespace hymoe::deck {

enum class JobKind { infer, lora, convert, plan, tokenize };
enum class DeviceChoice { automatic, cpu, cuda };

struct JobSection {
    JobKind kind = JobKind::infer;
    std::string name;    // default: the deck's folder name
    uint64_t seed = 0;   // keys every random stream (core/rng.h)
    std::string output;  // resolved path of the output folder (created after validation)
    DeviceChoice device = DeviceChoice::automatic;
    double device_memory = 0.9;  // of each GPU's free memory, split among the ranks sharing it
    double max_hours = 0;        // stop cleanly before this wall time (0 = no limit)
    bool overwrite = false;      // infer: rerun and replace a finished results.h5 (runtime/rerun.h)
};

struct ModelSection {
    std::string preset;         // built-in config name, or
    std::string config;         // resolved path of an HF/hymoe config.json
    std::string weights;        // resolved path of a safetensors folder or hymoe checkpoint, or
    bool init_random = false;   // init: random (seeded by job.seed)
    DType dtype = DType::bf16;  // storage of the matrices (model/weights.h; fp32 accumulation)
};

// Dense grid world = tp·dp·pp; expert grid world = etp·ep·edp·pp (parallel/grid.h).
struct ParallelSection {
    int tp = 1, pp = 1, dp = 1, ep = 1, etp = 1;
    int64_t rebalance_every = 0;  // engine steps between expert rebalances (model/eplb.h); 0 off
};

struct LoraSection {
    int rank = 16;
    double alpha = 32;
    double dropout = 0;
    std::vector<std::string> target_modules;  // subset of kLoraTargets
    bool rslora = false;                      // scale alpha/sqrt(r) instead of alpha/r
    bool per_expert = false;  // expert adapters: one per expert instead of one per layer
};

struct OptimizerSection {
    double lr = 1e-4;
    std::string scheduler = "cosine";  // cosine | linear | constant
    int warmup_steps = 0;
    double min_lr_ratio = 0.1;  // floor of the decay, as a fraction of lr
    double weight_decay = 0;
    double grad_clip = 1.0;  // global L2 norm; 0 = off
    double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
};

struct FinetuneSection {
    bool present = false;
    std::string method = "lora";
    DType base_dtype = DType::bf16;
    LoraSection lora;
    OptimizerSection optimizer;
    std::string domain_data, general_data;  // resolved paths of HDF5 token datasets
    double domain_ratio = 1, general_ratio = 0;
    int steps = 0;
    int micro_batch = 1, seq_len = 512, grad_accum = 1;
    int eval_every = 0;  // 0 = no evaluation
    std::string eval_domain, eval_general;
    int eval_batches = 8;
    std::string eval_metric = "domain_loss";  // domain_loss | general_loss: best and early stop
    int checkpoint_every = 0;                 // 0 = only at the end and on signal
    int checkpoint_keep = 3;
    bool checkpoint_best = true;      // checkpoints/best + adapters/best at the lowest eval_metric
    int early_stopping_patience = 0;  // evaluations without improvement; 0 = off
    double early_stopping_min_delta = 0;
    int log_every = 10;      // a step line (and results.h5 rewritten) every N steps and at the last
    bool recompute = false;  // per-layer activation checkpointing
    std::string on_nonfinite = "stop";  // a NaN/Inf loss or gradient: skip the batch | stop
    double loss_spike = 0;       // > 0: a loss above this × the mean of the last 20 counts as bad
    bool export_merged = false;  // also write the merged weights (safetensors) at the end
};

struct InferenceSection {
    bool present = false;
    std::string dataset;                          // resolved path: JSONL requests or HDF5 tokens
    std::map<std::string, std::string> adapters;  // name -> resolved adapter folder
    int max_new_tokens = 64;
    bool prompt_logprobs = false;         // teacher-forced log-probability of every prompt token
    int logprobs = 0;                     // top-N tokens and logprobs at each output token
    std::string on_bad_request = "fail";  // fail | skip
    bool batch_invariant = false;  // bit-identical results across batchings (backend/ops.h), slower
    int64_t shards = 1, shard = 0;  // array jobs: run the requests with index mod shards == shard
    double temperature = 0, top_p = 1;
    int top_k = 0;     // 0 = no top-k filter
    double min_p = 0;  // 0 = no min-p filter
    double presence_penalty = 0, frequency_penalty = 0, repetition_penalty = 1;  // none
    std::vector<std::string> stop;        // sampling.stop: requests' default stop strings
    std::vector<int64_t> stop_token_ids;  // sampling.stop_token_ids: their default stop tokens
    int n = 1;                            // sampling.n: their default samples
    int max_tokens = 8192, max_seqs = 64, prefill_chunk = 2048;
    int page_tokens = 64;
    int64_t pages = 0;             // 0 = auto: what memory allows
    std::string offload = "none";  // none | host | file
    std::string offload_path;      // file: the spill files' folder; "" = job.output
    DType kv_dtype = DType::bf16;  // kv_cache.dtype: the MLA/DSA cache rows (default model.dtype)
    bool prefix_cache = false;     // prefix_cache.enabled (runtime/prefix_cache.h)
    int64_t prefix_cache_bytes = int64_t{1} << 30;  // prefix_cache.max_bytes, per lane and rank
    int64_t image_max_patches = 4096;  // images.max_patches: patches per image (scaled down
                                       //   above it, io/image.h)
    int64_t image_max_pixels = int64_t{1} << 26;  // images.max_pixels: decoded H·W above it is a
                                                  //   bad request (oversized)
    int image_pool = 1;  // images.pool: mean-pool pool×pool patches before the 2×2 merger (image
                         //   tokens ÷ pool²)
};

// The tokenizer of text requests and tokenize jobs (text/tokenizer.h, text/chat.h).
struct TokenizerSection {
    bool present = false;
    std::string path;     // resolved tokenizer file or model folder
    std::string pattern;  // tiktoken files: cl100k_base | o200k_base | kimi | a regex; "" = by name
    std::string chat = "none";  // none | kimi | deepseek (presets) | template (the model's Jinja)
    text::ChatTemplate chat_template;  // the preset with the deck's bos, roles, generation_prefix;
                                       //   or tokenizer_config.json's chat_template
};

// kind: tokenize: JSONL text -> HDF5 token dataset (runtime/tokenize_job.cpp).
struct TokenizeSection {
    bool present = false;
    std::string dataset;                  // resolved JSONL path
    std::string output;                   // resolved HDF5 path (default <job.output>/tokens.h5)
    std::string eos;                      // a special token appended after each text; "" none
    int64_t max_line_bytes = 1 << 24;     // longer lines are bad input
    std::string on_bad_request = "fail";  // fail | skip
    int64_t chunk_lines = 4096;           // lines per journal chunk (the resume granularity)
};

struct ProfileSection {
    bool layers = true, experts = true;
};

// Hardware for plans and time estimates; defaults: one NVIDIA H200 node.
struct HardwareSection {
    double gpu_memory_gb = 141, hbm_tb_s = 4.8, tflops = 989;
    double nvlink_gb_s = 900, ib_gbit_s = 400;
    int ib_links = 8, gpus_per_node = 8;
};

struct PlanSection {
    int gpus = 0;  // > 0: search the layouts for this many GPUs
};

// Where a key came from, for error messages: "deck.yaml:12:5" or "--set parallel.tp=3".
struct Source {
    std::string where;
};

struct Deck {
    std::string path;           // the deck file as given on the command line
    std::string dir;            // its folder: relative paths resolve against it
    std::string text;           // the bytes read
    std::string resolved_yaml;  // the resolved deck, defaults filled in
    JobSection job;
    ModelSection model;
    ParallelSection parallel;
    FinetuneSection finetune;
    InferenceSection inference;
    TokenizerSection tokenizer;
    TokenizeSection tokenize;
    ProfileSection profile;
    HardwareSection hardware;
    PlanSection plan;
    std::map<std::string, Source> sources;  // key path -> where it was set (or its nearest parent)

    // "deck.yaml:LINE:COL" (or "--set k=v") where a key, or its nearest given parent, was set.
    std::string where(const std::string& key_path) const;
    // where() + ": key.path", the prefix of messages about a key checked after parsing.
    std::string locate(const std::string& key_path) const;
};

// Parse deck text. overrides are "key.path=value" strings from --set (value parsed as YAML).
// Throws hymoe::Error (Exit::invalid, collective) with one line:
//   "<path>:LINE:COL: key.path: what is wrong (what is allowed)".
Deck parse_deck(const std::string& text,
                const std::string& path,
                const std::vector<std::string>& overrides);

// Read the deck file; a missing or unreadable file is an Exit::invalid error naming it.
std::string read_deck_file(const std::string& path);

const char* to_string(JobKind kind);
const char* to_string(DeviceChoice device);

// LoRA target names accepted by finetune.lora.target_modules.
extern const std::vector<std::string> kLoraTargets;

}  // namespace hymoe::deck
