// The deck schema table (deck/schema.h): one line per section and key. The parser reads every
// key through it, --describe-deck prints it and docs/reference/deck.md is generated from that.
#include "schema.h"

#include <map>

#include "hymoe/core/error.h"
#include "hymoe/deck/deck.h"

namespace hymoe::deck {

const std::vector<std::string> kLoraTargets = {"q_proj",
                                               "k_proj",
                                               "v_proj",
                                               "o_proj",
                                               "gate_proj",
                                               "up_proj",
                                               "down_proj",
                                               "experts",
                                               "shared_experts"};

namespace {

using T = KeyType;
constexpr double kRanks = 1 << 20;                 // parallel sizes
constexpr double kBig = double(int64_t{1} << 40);  // "no upper bound" (printed as ">= lo")
constexpr double kInt64 = 9.3e18;                  // the whole int64 range (clamped on use)
const std::vector<std::string> kDtypes = {"bf16", "fp16", "fp32"};
const std::vector<std::string> kFailSkip = {"fail", "skip"};

// clang-format off
const std::vector<KeySpec> kSchema = {
{"job", T::section, "", 0, 0, {}, "what the job is; required"},
{"job.kind", T::choice, nullptr, 0, 0, {"infer", "lora", "convert", "plan", "tokenize"}, "what the job does: batch inference, LoRA fine-tuning, weight conversion, a memory plan, or JSONL text -> an HDF5 token dataset"},
{"job.name", T::text, "the deck's folder name", 0, 0, {}, "job name, used in the log"},
{"job.seed", T::integer, "0", 0, kInt64, {}, "seeds every random stream (model.init: random, sampling, dropout, data order)"},
{"job.output", T::text, "out", 0, 0, {}, "output folder, relative to the deck's folder; created only after validation"},
{"job.device", T::choice, "auto", 0, 0, {"auto", "cpu", "cuda"}, "where infer and lora run their passes: cuda on each rank's GPU, cpu, or auto (the GPU when the job can have one, else the CPU with one log line saying why); cuda that cannot be had exits 2 naming this key; other kinds ignore it"},
{"job.device_memory", T::number, "0.9", 0.01, 1, {}, "infer and lora on a GPU: the share of each GPU's free memory (measured when the model is uploaded) that the ranks computing on it take for their arenas, divided evenly among them (several ranks of one node may share a GPU: rank r takes GPU local rank mod the GPU count)"},
{"job.max_hours", T::number, "0", 0, 1e5, {}, "infer and lora: stop cleanly (exit 75, resumable) at 99% of this wall time; 0 = no limit"},
{"job.overwrite", T::flag, "false", 0, 0, {}, "infer: replace a finished output made by a different deck (otherwise such a rerun is refused; the same deck is \"already complete\", exit 0)"},
{"model", T::section, "", 0, 0, {}, "the model: a built-in preset or a config file, and its weights; required"},
{"model.preset", T::text, "", 0, 0, {}, "a built-in config: tiny, tiny-kimi, tiny-deepseek, mid, flagship-2.8t (give preset or config, not both)"},
{"model.config", T::file, "", 0, 0, {}, "an HF config.json (kimi_linear, deepseek_v32) or a native hymoe config (docs/reference/model-config.md)"},
{"model.weights", T::file_or_dir, "", 0, 0, {}, "an HF safetensors folder or file, or a hymoe checkpoint folder made by convert; for convert, the safetensors to convert; every kind but plan and tokenize needs weights or init: random"},
{"model.init", T::choice, "none", 0, 0, {"none", "random"}, "random: random weights seeded by job.seed, keyed by tensor name"},
{"model.dtype", T::choice, "bf16", 0, 0, kDtypes, "storage of the weight matrices (vectors and the router stay fp32) on the CPU and the GPU, and the default of inference.kv_cache.dtype; fp32 is exact; bf16 products accumulate in fp32 (docs/guide/precision.md)"},
{"parallel", T::section, "", 0, 0, {}, "the layout: tp*dp*pp ranks; experts over etp*ep*edp of the same ranks (edp = tp*dp/(etp*ep))"},
{"parallel.tp", T::integer, "1", 1, kRanks, {}, "tensor parallel: attention and KDA heads, dense FFN, vocabulary, shared experts"},
{"parallel.pp", T::integer, "1", 1, kRanks, {}, "pipeline stages"},
{"parallel.dp", T::integer, "1", 1, kRanks, {}, "data-parallel replicas"},
{"parallel.ep", T::integer, "1", 1, kRanks, {}, "expert parallel: routed experts sharded over ep ranks"},
{"parallel.etp", T::integer, "1", 1, kRanks, {}, "expert tensor parallel: each expert split over etp ranks"},
{"parallel.rebalance_every", T::integer, "0", 0, 1e9, {}, "infer: engine steps between expert rebalances (ep > 1, MoE layers); 0 = never"},
{"finetune", T::section, "", 0, 0, {}, "LoRA fine-tuning; required for kind lora, also planned by plan; not allowed for infer or convert"},
{"finetune.method", T::choice, "lora", 0, 0, {"lora"}, "fine-tuning method"},
{"finetune.base_dtype", T::choice, "bf16", 0, 0, kDtypes, "accepted as practitioners write it; the frozen base is held at model.dtype (set that instead)"},
{"finetune.lora", T::section, "", 0, 0, {}, "the adapters"},
{"finetune.lora.rank", T::integer, "16", 1, 65536, {}, "adapter rank r"},
{"finetune.lora.alpha", T::number, "2 x rank", 1e-6, 1e6, {}, "scale alpha/r (alpha/sqrt(r) with rslora)"},
{"finetune.lora.dropout", T::number, "0", 0, 0.99, {}, "dropout on the adapter input"},
{"finetune.lora.target_modules", T::list, "[q_proj, k_proj, v_proj, o_proj] (also when empty)", 0, 0, kLoraTargets, "the projections that get adapters"},
{"finetune.lora.rslora", T::flag, "false", 0, 0, {}, "rank-stabilised scaling alpha/sqrt(r)"},
{"finetune.lora.expert_adapters", T::choice, "shared", 0, 0, {"shared", "per_expert"}, "expert adapters: one per layer shared by its experts, or one per expert"},
{"finetune.optimizer", T::section, "", 0, 0, {}, "AdamW and the learning-rate schedule"},
{"finetune.optimizer.lr", T::number, "0.0001", 0, 10, {}, "peak learning rate"},
{"finetune.optimizer.scheduler", T::choice, "cosine", 0, 0, {"cosine", "linear", "constant"}, "decay after warm-up"},
{"finetune.optimizer.warmup_steps", T::integer, "0", 0, kBig, {}, "linear warm-up steps"},
{"finetune.optimizer.min_lr_ratio", T::number, "0.1", 0, 1, {}, "lowest lr of the decay, as a fraction of lr"},
{"finetune.optimizer.weight_decay", T::number, "0", 0, 10, {}, "decoupled weight decay"},
{"finetune.optimizer.grad_clip", T::number, "1", 0, 1e6, {}, "clip by global L2 norm; 0 = off"},
{"finetune.optimizer.beta1", T::number, "0.9", 0, 0.999999, {}, "Adam beta1"},
{"finetune.optimizer.beta2", T::number, "0.999", 0, 0.999999, {}, "Adam beta2"},
{"finetune.optimizer.eps", T::number, "1e-08", 1e-30, 1, {}, "Adam epsilon"},
{"finetune.data", T::section, "", 0, 0, {}, "the training token datasets (HDF5, as a tokenize job writes them)"},
{"finetune.data.domain", T::file, nullptr, 0, 0, {}, "domain token dataset"},
{"finetune.data.general", T::file, "", 0, 0, {}, "general token dataset, mixed in against forgetting"},
{"finetune.data.domain_ratio", T::number, "1, or 0.8 with data.general", 0, 1, {}, "share of domain samples"},
{"finetune.data.general_ratio", T::number, "1 - domain_ratio", 0, 1, {}, "share of general samples; the two ratios sum to 1"},
{"finetune.steps", T::integer, nullptr, 1, kBig, {}, "optimizer steps"},
{"finetune.batch", T::section, "", 0, 0, {}, "batch shape"},
{"finetune.batch.micro_batch", T::integer, "1", 1, 1 << 20, {}, "sequences per micro-batch (per dp replica)"},
{"finetune.batch.seq_len", T::integer, "512", 2, 1 << 24, {}, "tokens per sequence"},
{"finetune.batch.grad_accum", T::integer, "1", 1, 1 << 20, {}, "micro-batches per optimizer step"},
{"finetune.eval", T::section, "", 0, 0, {}, "evaluation during training"},
{"finetune.eval.every", T::integer, "0", 0, kBig, {}, "evaluate every N steps (needs eval.domain or eval.general); 0 = never"},
{"finetune.eval.domain", T::file, "", 0, 0, {}, "domain evaluation set"},
{"finetune.eval.general", T::file, "", 0, 0, {}, "general evaluation set"},
{"finetune.eval.batches", T::integer, "8", 1, 1 << 20, {}, "batches per evaluation"},
{"finetune.eval.metric", T::choice, "domain_loss, or general_loss without eval.domain", 0, 0, {"domain_loss", "general_loss"}, "the eval loss that picks checkpoints/best and drives early_stopping (its set must be given)"},
{"finetune.checkpoint", T::section, "", 0, 0, {}, "training checkpoints"},
{"finetune.checkpoint.every", T::integer, "0", 0, kBig, {}, "checkpoint every N steps; 0 = only at the end and on a signal"},
{"finetune.checkpoint.keep", T::integer, "3", 1, 1000, {}, "checkpoints kept (besides the one checkpoints/best names)"},
{"finetune.checkpoint.best", T::flag, "true", 0, 0, {}, "with eval.every: a checkpoint at each evaluation after step 0 that lowers eval.metric, named by checkpoints/best and never pruned, its adapter in adapters/best"},
{"finetune.early_stopping", T::section, "", 0, 0, {}, "stop when eval.metric stops improving (needs eval.every)"},
{"finetune.early_stopping.patience", T::integer, "0", 0, kBig, {}, "stop after this many evaluations in a row that do not lower the best eval.metric by more than min_delta (step 0's not counted); 0 = off"},
{"finetune.early_stopping.min_delta", T::number, "0", 0, 1e6, {}, "the least decrease that counts as an improvement"},
{"finetune.log_every", T::integer, "10", 1, kBig, {}, "a step line every N steps, at the last and at a stop (loss and grad norm: means over the interval's steps; lr at its last step; tokens/s over the interval; ETA); results.h5 is rewritten at the same steps and at every evaluation and checkpoint"},
{"finetune.recompute", T::flag, "false", 0, 0, {}, "per-layer activation checkpointing"},
{"finetune.on_nonfinite", T::choice, "stop", 0, 0, {"stop", "skip"}, "a NaN/Inf loss or gradient (or a loss spike): exit 3 naming step, layer and rank, or skip the update"},
{"finetune.loss_spike", T::number, "0", 0, 1e6, {}, "> 0: a loss above this x the mean of the last 20 counts as bad"},
{"finetune.export_merged", T::flag, "false", 0, 0, {}, "also write out/merged/ (base weights with the adapter merged, safetensors)"},
{"inference", T::section, "", 0, 0, {}, "batch inference; required for kind infer, also planned by plan; not allowed for convert"},
{"inference.dataset", T::file, nullptr, 0, 0, {}, "the requests: JSONL (tokens, text or messages per line) or an HDF5 token dataset (.h5)"},
{"inference.adapters", T::path_map, "{}", 0, 0, {}, "name -> PEFT adapter folder; a request's \"adapter\": NAME picks one"},
{"inference.max_new_tokens", T::integer, "64", 0, 1 << 24, {}, "tokens generated per request that does not give its own; 0 = score the prompt only"},
{"inference.prompt_logprobs", T::flag, "false", 0, 0, {}, "also write the teacher-forced log-probability of every prompt token"},
{"inference.logprobs", T::integer, "0", 0, 64, {}, "also write the N most likely tokens and their logprobs at every output token"},
{"inference.on_bad_request", T::choice, "fail", 0, 0, kFailSkip, "a bad request: stop with exit 3, or log a warning and go on"},
{"inference.batch_invariant", T::flag, "false", 0, 0, {}, "bit-identical results whatever shares a batch (GEMM rows independent of the call: calls of 8 rows on the CPU, the invariant GEMM and no fused kernels on the GPU); slower"},
{"inference.shards", T::integer, "1", 1, 1e9, {}, "array jobs: the dataset is cut into this many shards by request index"},
{"inference.shard", T::integer, "0", 0, 1e9, {}, "the shard this job runs (below shards); hymoe --gather merges the shards' results"},
{"inference.sampling", T::section, "", 0, 0, {}, "token sampling"},
{"inference.sampling.temperature", T::number, "0", 0, 100, {}, "0 = greedy"},
{"inference.sampling.top_p", T::number, "1", 1e-6, 1, {}, "nucleus sampling"},
{"inference.sampling.top_k", T::integer, "0", 0, 1 << 24, {}, "0 = no top-k filter"},
{"inference.sampling.min_p", T::number, "0", 0, 1, {}, "drop tokens below min_p times the most likely one's probability (after the temperature); 0 = none"},
{"inference.sampling.presence_penalty", T::number, "0", -2, 2, {}, "subtracted from the logit of every token already in the output"},
{"inference.sampling.frequency_penalty", T::number, "0", -2, 2, {}, "subtracted from a token's logit once per time it is in the output"},
{"inference.sampling.repetition_penalty", T::number, "1", 1e-6, 100, {}, "divides positive (multiplies negative) logits of tokens in the prompt or output; 1 = none"},
{"inference.sampling.stop", T::list, "[]", 0, 0, {}, "stop strings of requests that give no \"stop\": generation ends once the output text holds one (cut before it); needs tokenizer.path"},
{"inference.sampling.stop_token_ids", T::list, "[]", 0, 0, {}, "stop token ids of requests that give no \"stop_token_ids\": generation ends when one is sampled (kept as the last token)"},
{"inference.sampling.n", T::integer, "1", 1, 4096, {}, "samples of each request that gives no \"n\""},
{"inference.batch", T::section, "", 0, 0, {}, "continuous batching"},
{"inference.batch.max_tokens", T::integer, "8192", 1, 1 << 30, {}, "tokens per engine step (per pipeline lane, per dp replica)"},
{"inference.batch.max_seqs", T::integer, "64", 1, 1 << 24, {}, "sequences in flight per dp replica"},
{"inference.batch.prefill_chunk", T::integer, "2048", 1, 1 << 30, {}, "prompts are prefilled in chunks of at most this many tokens (<= batch.max_tokens)"},
{"inference.kv_cache", T::section, "", 0, 0, {}, "the paged KV cache of the attention layers"},
{"inference.kv_cache.page_tokens", T::integer, "64", 1, 1 << 20, {}, "tokens per KV page"},
{"inference.kv_cache.pages", T::integer_or_auto, "auto", 1, kBig, {}, "KV pages per dp replica; auto = what half the free memory holds (the plan: every sequence at full context); running out preempts"},
{"inference.kv_cache.offload", T::choice, "none", 0, 0, {"none", "host", "file"}, "slower tier for the pages of inactive layers: a spill file (file), pinned host memory on the GPU (host; on the CPU = none)"},
{"inference.kv_cache.offload_path", T::dir, "", 0, 0, {}, "where offload: file makes its spill files; default the job's output folder"},
{"inference.kv_cache.dtype", T::choice, "model.dtype", 0, 0, kDtypes, "storage of the cached MLA/DSA latent, rope key and indexer key (reads widen to fp32); bf16 also runs the DSA indexer in bf16 (bf16 keys and queries, fp32 sums; docs/guide/precision-fp8-kv.md), fp32 keeps it exact; the KDA state stays fp32; the GPU stores fp32"},
{"inference.prefix_cache", T::section, "", 0, 0, {}, "reuse the prefill of prompt prefixes shared between requests (KV pages + KDA state snapshots); docs/guide/prefix-cache.md"},
{"inference.prefix_cache.enabled", T::flag, "false", 0, 0, {}, "look prompts up by block hashes and restore their longest cached prefix; results bit-identical with it off under batch_invariant; not with prompt_logprobs or images; on the GPU its KDA snapshots are host copies of the device states"},
{"inference.prefix_cache.max_bytes", T::integer, "1073741824", 1, kBig, {}, "KDA state snapshots (and prefix tokens) kept per pipeline lane per rank, least recently used dropped first; their KV pages count in kv_cache.pages"},
{"inference.images", T::section, "", 0, 0, {}, "image requests"},
{"inference.images.max_patches", T::integer, "4096", 1, 1 << 24, {}, "patches per image; a larger image is scaled down to about this many"},
{"inference.images.max_pixels", T::integer, "67108864", 1, double(int64_t{1} << 34), {}, "a decoded image with more pixels (H*W) is a bad request"},
{"inference.images.pool", T::integer, "1", 1, 16, {}, "mean-pool pool x pool patches after the tower, cutting an image's tokens by pool^2"},
{"tokenizer", T::section, "", 0, 0, {}, "the tokenizer of text and chat requests; required for kind tokenize"},
{"tokenizer.path", T::file_or_dir, nullptr, 0, 0, {}, "a tokenizer.json, a tiktoken rank file, or a model folder holding one (with tokenizer_config.json for the special tokens)"},
{"tokenizer.pattern", T::text, "", 0, 0, {}, "rank files: cl100k_base, o200k_base, kimi, or a regex; empty = by the file name, else kimi"},
{"tokenizer.chat", T::choice, "none", 0, 0, {"none", "kimi", "deepseek", "template"}, "the chat template the keys below start from; none = empty prefixes and suffixes; template = the chat_template of tokenizer_config.json beside the tokenizer (Jinja, docs/guide/chat-templates.md), without the keys below"},
{"tokenizer.bos", T::text, "the chat preset's", 0, 0, {}, "written once before the first message"},
{"tokenizer.roles", T::section, "", 0, 0, {}, "text around each message: prefix + content + suffix"},
{"tokenizer.roles.system", T::section, "", 0, 0, {}, "system messages"},
{"tokenizer.roles.system.prefix", T::text, "the chat preset's", 0, 0, {}, "before a system message"},
{"tokenizer.roles.system.suffix", T::text, "the chat preset's", 0, 0, {}, "after a system message"},
{"tokenizer.roles.user", T::section, "", 0, 0, {}, "user messages"},
{"tokenizer.roles.user.prefix", T::text, "the chat preset's", 0, 0, {}, "before a user message"},
{"tokenizer.roles.user.suffix", T::text, "the chat preset's", 0, 0, {}, "after a user message"},
{"tokenizer.roles.assistant", T::section, "", 0, 0, {}, "assistant messages"},
{"tokenizer.roles.assistant.prefix", T::text, "the chat preset's", 0, 0, {}, "before an assistant message"},
{"tokenizer.roles.assistant.suffix", T::text, "the chat preset's", 0, 0, {}, "after an assistant message"},
{"tokenizer.generation_prefix", T::text, "the chat preset's", 0, 0, {}, "after the last message of a request: opens the assistant's turn"},
{"tokenize", T::section, "", 0, 0, {}, "JSONL text -> HDF5 tokens; required for kind tokenize, allowed only there"},
{"tokenize.dataset", T::file, nullptr, 0, 0, {}, "JSONL, one document per line: text, prompt + completion, or messages"},
{"tokenize.output", T::text, "tokens.h5", 0, 0, {}, "the HDF5 file, relative to job.output"},
{"tokenize.eos", T::text, "", 0, 0, {}, "a special token appended (as a target) after each text and completion; empty = none"},
{"tokenize.max_line_bytes", T::integer, "16777216", 16, double(int64_t{1} << 32), {}, "a longer line is a bad line"},
{"tokenize.on_bad_request", T::choice, "fail", 0, 0, kFailSkip, "a bad line: stop with exit 3, or log a warning and leave it out"},
{"tokenize.chunk_lines", T::integer, "4096", 1, 1 << 24, {}, "lines per chunk: the unit of work per rank and of resume"},
{"profile", T::section, "", 0, 0, {}, "what infer measures into profile.h5"},
{"profile.layers", T::flag, "true", 0, 0, {}, "per-layer wall time, GEMM rate and weight-read rate"},
{"profile.experts", T::flag, "true", 0, 0, {}, "models with MoE layers: the expert load of every MoE layer"},
{"hardware", T::section, "", 0, 0, {}, "the GPUs a plan is made for; the defaults describe one NVIDIA H200 node"},
{"hardware.gpu_memory_gb", T::number, "141", 0.1, 1e6, {}, "memory per GPU (GB = 1e9 bytes)"},
{"hardware.hbm_tb_s", T::number, "4.8", 1e-3, 1e4, {}, "HBM bandwidth per GPU (TB/s)"},
{"hardware.tflops", T::number, "989", 1e-3, 1e6, {}, "peak compute per GPU (TFLOP/s)"},
{"hardware.nvlink_gb_s", T::number, "900", 1e-3, 1e6, {}, "bandwidth per GPU inside one node (GB/s)"},
{"hardware.ib_gbit_s", T::number, "400", 1e-3, 1e6, {}, "one InfiniBand link (Gbit/s)"},
{"hardware.ib_links", T::integer, "8", 1, 1024, {}, "InfiniBand links per node, shared by its GPUs"},
{"hardware.gpus_per_node", T::integer, "8", 1, 1024, {}, "GPUs per node: which groups stay inside a node; the search's limit on tp and etp"},
{"plan", T::section, "", 0, 0, {}, "the layout search of plans and --check"},
{"plan.gpus", T::integer, "0", 0, kRanks, {}, "> 0: also search every layout for this many GPUs"},
};
// clang-format on

}  // namespace

const std::vector<KeySpec>& deck_schema() {
    return kSchema;
}

const KeySpec& key_spec(const std::string& path) {
    static const std::map<std::string, const KeySpec*> index = [] {
        std::map<std::string, const KeySpec*> m;
        for (const KeySpec& k : kSchema)
            m[k.path] = &k;
        return m;
    }();
    auto it = index.find(path);
    HYMOE_CHECK(it != index.end(), "deck key ", path, " is not in the schema table");
    return *it->second;
}

std::vector<std::string> section_keys(const std::string& section) {
    std::vector<std::string> keys;
    const std::string prefix = section.empty() ? "" : section + ".";
    for (const KeySpec& k : kSchema) {
        const std::string p = k.path;
        if (p.size() > prefix.size() && p.compare(0, prefix.size(), prefix) == 0 &&
            p.find('.', prefix.size()) == std::string::npos)
            keys.push_back(p.substr(prefix.size()));
    }
    return keys;
}

const char* type_name(KeyType t) {
    switch (t) {
        case T::section:
            return "section";
        case T::integer:
            return "integer";
        case T::integer_or_auto:
            return "integer or auto";
        case T::number:
            return "number";
        case T::flag:
            return "bool";
        case T::choice:
            return "choice";
        case T::text:
            return "string";
        case T::file:
            return "path (file)";
        case T::dir:
            return "path (folder)";
        case T::file_or_dir:
            return "path (file or folder)";
        case T::list:
            return "list";
        case T::path_map:
            return "map name -> folder";
    }
    return "?";
}

}  // namespace hymoe::deck
