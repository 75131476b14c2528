// The deck schema: every section, key, default and allowed range (README "Deck reference" lists
// the same), the cross-key rules that need no model or MPI, and --set overrides.
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <yaml-cpp/yaml.h>

#include "hymoe/core/error.h"
#include "hymoe/deck/deck.h"
#include "reader.h"

namespace hymoe::deck {

namespace fs = std::filesystem;

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

constexpr int64_t kMaxRanks = 1 << 20;
constexpr int64_t kBig = int64_t{1} << 40;

DType parse_dtype(const std::string& s) {
    return s == "bf16" ? DType::bf16 : s == "fp16" ? DType::f16 : DType::f32;
}

void read_job(Section s, JobSection& job, const std::string& deck_dir) {
    std::string kind =
        s.choice("kind", std::nullopt, {"infer", "lora", "convert", "plan", "tokenize"});
    job.kind = kind == "infer"     ? JobKind::infer
               : kind == "lora"    ? JobKind::lora
               : kind == "convert" ? JobKind::convert
               : kind == "plan"    ? JobKind::plan
                                   : JobKind::tokenize;
    std::string folder = fs::absolute(deck_dir).lexically_normal().filename().string();
    job.name = s.text("name", folder.empty() ? std::string("job") : folder);
    job.seed = static_cast<uint64_t>(s.integer("seed", 0, 0, INT64_MAX));
    std::string out = s.text("output", std::string("out"));
    job.output = (fs::path(out).is_relative() ? fs::path(deck_dir) / out : fs::path(out))
                     .lexically_normal()
                     .string();
    std::string device = s.choice("device", std::string("auto"), {"auto", "cpu", "cuda"});
    job.device = device == "cpu"    ? DeviceChoice::cpu
                 : device == "cuda" ? DeviceChoice::cuda
                                    : DeviceChoice::automatic;
    job.max_hours = s.number("max_hours", 0.0, 0.0, 1e5);
    job.overwrite = s.flag("overwrite", false);
    s.finish();
}

void read_model(Section s, ModelSection& m, JobKind kind) {
    bool has_preset = s.has("preset"), has_config = s.has("config");
    if (has_preset && has_config)
        s.fail("config", "give either model.preset or model.config, not both");
    if (!has_preset && !has_config)
        s.fail("preset", "required: either model.preset (a built-in name) or model.config");
    m.preset = s.text("preset", std::string());
    m.config = s.path("config", false, PathKind::file, true);
    m.weights = s.path("weights", false, PathKind::file_or_dir, true);
    m.init_random = s.choice("init", std::string("none"), {"none", "random"}) == "random";
    const bool has_weights = !m.weights.empty();
    if (has_weights && m.init_random)
        s.fail("init", "give either model.weights or model.init: random, not both");
    bool needs_weights = kind != JobKind::plan && kind != JobKind::tokenize;
    if (needs_weights && !has_weights && !m.init_random)
        s.fail("weights",
               "required for this job kind: model.weights (a folder) or model.init: random");
    if (kind == JobKind::convert && !has_weights)
        s.fail("weights", "a convert job needs model.weights (the safetensors folder to convert)");
    m.dtype = parse_dtype(s.choice("dtype", std::string("bf16"), {"bf16", "fp16", "fp32"}));
    s.finish();
}

void read_parallel(Section s, ParallelSection& p) {
    p.tp = static_cast<int>(s.integer("tp", 1, 1, kMaxRanks));
    p.pp = static_cast<int>(s.integer("pp", 1, 1, kMaxRanks));
    p.dp = static_cast<int>(s.integer("dp", 1, 1, kMaxRanks));
    p.ep = static_cast<int>(s.integer("ep", 1, 1, kMaxRanks));
    p.etp = static_cast<int>(s.integer("etp", 1, 1, kMaxRanks));
    p.rebalance_every = s.integer("rebalance_every", 0, 0, 1'000'000'000);
    s.finish();
}

void read_finetune(Section s, FinetuneSection& f) {
    f.present = true;
    f.method = s.choice("method", std::string("lora"), {"lora"});
    f.base_dtype =
        parse_dtype(s.choice("base_dtype", std::string("bf16"), {"bf16", "fp16", "fp32"}));
    {
        Section l = s.section("lora");
        f.lora.rank = static_cast<int>(l.integer("rank", 16, 1, 65536));
        f.lora.alpha = l.number("alpha", 2.0 * f.lora.rank, 1e-6, 1e6);
        f.lora.dropout = l.number("dropout", 0.0, 0.0, 0.99);
        f.lora.target_modules = l.list("target_modules", kLoraTargets);
        if (f.lora.target_modules.empty())
            f.lora.target_modules = {"q_proj", "k_proj", "v_proj", "o_proj"};
        f.lora.rslora = l.flag("rslora", false);
        f.lora.per_expert =
            l.choice("expert_adapters", std::string("shared"), {"shared", "per_expert"}) ==
            "per_expert";
        l.finish();
    }
    {
        Section o = s.section("optimizer");
        OptimizerSection& opt = f.optimizer;
        opt.lr = o.number("lr", 1e-4, 0.0, 10.0);
        opt.scheduler =
            o.choice("scheduler", std::string("cosine"), {"cosine", "linear", "constant"});
        opt.warmup_steps = static_cast<int>(o.integer("warmup_steps", 0, 0, kBig));
        opt.min_lr_ratio = o.number("min_lr_ratio", 0.1, 0.0, 1.0);
        opt.weight_decay = o.number("weight_decay", 0.0, 0.0, 10.0);
        opt.grad_clip = o.number("grad_clip", 1.0, 0.0, 1e6);
        opt.beta1 = o.number("beta1", 0.9, 0.0, 0.999999);
        opt.beta2 = o.number("beta2", 0.999, 0.0, 0.999999);
        opt.eps = o.number("eps", 1e-8, 1e-30, 1.0);
        o.finish();
    }
    {
        Section d = s.section("data");
        f.domain_data = d.path("domain", true, PathKind::file, true);
        f.general_data = d.path("general", false, PathKind::file, true);
        f.domain_ratio = d.number("domain_ratio", f.general_data.empty() ? 1.0 : 0.8, 0.0, 1.0);
        f.general_ratio = d.number("general_ratio", 1.0 - f.domain_ratio, 0.0, 1.0);
        if (std::abs(f.domain_ratio + f.general_ratio - 1.0) > 1e-9)
            d.fail("general_ratio",
                   cat("domain_ratio + general_ratio = ",
                       f.domain_ratio + f.general_ratio,
                       " (they must sum to 1)"));
        if (f.general_ratio > 0 && f.general_data.empty())
            d.fail("general_ratio", "is above 0 but finetune.data.general is not given");
        d.finish();
    }
    f.steps = static_cast<int>(s.integer("steps", std::nullopt, 1, kBig));
    {
        Section b = s.section("batch");
        f.micro_batch = static_cast<int>(b.integer("micro_batch", 1, 1, 1 << 20));
        f.seq_len = static_cast<int>(b.integer("seq_len", 512, 2, 1 << 24));
        f.grad_accum = static_cast<int>(b.integer("grad_accum", 1, 1, 1 << 20));
        b.finish();
    }
    {
        Section e = s.section("eval");
        f.eval_every = static_cast<int>(e.integer("every", 0, 0, kBig));
        f.eval_domain = e.path("domain", false, PathKind::file, true);
        f.eval_general = e.path("general", false, PathKind::file, true);
        f.eval_batches = static_cast<int>(e.integer("batches", 8, 1, 1 << 20));
        if (f.eval_every > 0 && f.eval_domain.empty() && f.eval_general.empty())
            e.fail("every", "evaluation asked for, but neither eval.domain nor eval.general given");
        e.finish();
    }
    {
        Section c = s.section("checkpoint");
        f.checkpoint_every = static_cast<int>(c.integer("every", 0, 0, kBig));
        f.checkpoint_keep = static_cast<int>(c.integer("keep", 3, 1, 1000));
        c.finish();
    }
    f.recompute = s.flag("recompute", false);
    f.on_nonfinite = s.choice("on_nonfinite", std::string("stop"), {"stop", "skip"});
    f.loss_spike = s.number("loss_spike", 0.0, 0.0, 1e6);
    f.export_merged = s.flag("export_merged", false);
    s.finish();
}

void read_inference(Section s, InferenceSection& in) {
    in.present = true;
    in.dataset = s.path("dataset", true, PathKind::file, true);
    in.adapters = s.path_map("adapters", PathKind::dir);
    in.max_new_tokens = static_cast<int>(s.integer("max_new_tokens", 64, 0, 1 << 24));
    in.prompt_logprobs = s.flag("prompt_logprobs", false);
    in.logprobs = static_cast<int>(s.integer("logprobs", 0, 0, 64));
    in.on_bad_request = s.choice("on_bad_request", std::string("fail"), {"fail", "skip"});
    in.batch_invariant = s.flag("batch_invariant", false);
    in.shards = s.integer("shards", 1, 1, 1'000'000'000);
    in.shard = s.integer("shard", 0, 0, 1'000'000'000);
    if (in.shard >= in.shards)
        s.fail("shard", cat(in.shard, " is not below inference.shards = ", in.shards));
    {
        Section p = s.section("sampling");
        in.temperature = p.number("temperature", 0.0, 0.0, 100.0);
        in.top_p = p.number("top_p", 1.0, 1e-6, 1.0);
        in.top_k = static_cast<int>(p.integer("top_k", 0, 0, 1 << 24));
        p.finish();
    }
    {
        Section b = s.section("batch");
        in.max_tokens = static_cast<int>(b.integer("max_tokens", 8192, 1, 1 << 30));
        in.max_seqs = static_cast<int>(b.integer("max_seqs", 64, 1, 1 << 24));
        in.prefill_chunk = static_cast<int>(b.integer("prefill_chunk", 2048, 1, 1 << 30));
        if (in.prefill_chunk > in.max_tokens)
            b.fail("prefill_chunk",
                   cat(in.prefill_chunk, " is larger than batch.max_tokens = ", in.max_tokens));
        b.finish();
    }
    {
        Section k = s.section("kv_cache");
        in.page_tokens = static_cast<int>(k.integer("page_tokens", 64, 1, 1 << 20));
        in.pages = k.integer_or_auto("pages", 1, kBig);
        in.offload = k.choice("offload", std::string("none"), {"none", "host", "file"});
        in.offload_path = k.path("offload_path", false, PathKind::dir, true);
        k.finish();
    }
    {
        Section im = s.section("images");
        in.image_max_patches = im.integer("max_patches", 4096, 1, int64_t{1} << 24);
        in.image_max_pixels = im.integer("max_pixels", int64_t{1} << 26, 1, int64_t{1} << 34);
        in.image_pool = static_cast<int>(im.integer("pool", 1, 1, 16));
        im.finish();
    }
    s.finish();
}

void read_chat_role(Section s, text::ChatRole& role) {
    role.prefix = s.text("prefix", role.prefix);
    role.suffix = s.text("suffix", role.suffix);
    s.finish();
}

void read_tokenizer(Section s, TokenizerSection& t) {
    t.present = true;
    t.path = s.path("path", true, PathKind::file_or_dir, true);
    t.pattern = s.text("pattern", std::string());
    std::vector<std::string> chats = {"none"};
    chats.insert(chats.end(), text::kChatPresets.begin(), text::kChatPresets.end());
    t.chat = s.choice("chat", std::string("none"), chats);
    text::ChatTemplate& c = t.chat_template;
    if (t.chat != "none")
        c = text::chat_preset(t.chat);
    c.bos = s.text("bos", c.bos);
    {
        Section r = s.section("roles");
        for (const char* role : {"system", "user", "assistant"})
            read_chat_role(r.section(role), c.roles[role]);
        r.finish();
    }
    c.generation_prefix = s.text("generation_prefix", c.generation_prefix);
    s.finish();
}

void read_tokenize(Section s, TokenizeSection& t, const std::string& output_dir) {
    t.present = true;
    t.dataset = s.path("dataset", true, PathKind::file, true);
    const std::string out = s.text("output", std::string("tokens.h5"));
    t.output = (fs::path(out).is_relative() ? fs::path(output_dir) / out : fs::path(out))
                   .lexically_normal()
                   .string();
    t.eos = s.text("eos", std::string());
    t.max_line_bytes = s.integer("max_line_bytes", 1 << 24, 16, int64_t{1} << 32);
    t.on_bad_request = s.choice("on_bad_request", std::string("fail"), {"fail", "skip"});
    t.chunk_lines = s.integer("chunk_lines", 4096, 1, 1 << 24);
    s.finish();
}

void read_profile(Section s, ProfileSection& p) {
    p.layers = s.flag("layers", true);
    p.experts = s.flag("experts", true);
    s.finish();
}

void read_hardware(Section s, HardwareSection& h) {
    h.gpu_memory_gb = s.number("gpu_memory_gb", 141.0, 0.1, 1e6);
    h.hbm_tb_s = s.number("hbm_tb_s", 4.8, 1e-3, 1e4);
    h.tflops = s.number("tflops", 989.0, 1e-3, 1e6);
    h.nvlink_gb_s = s.number("nvlink_gb_s", 900.0, 1e-3, 1e6);
    h.ib_gbit_s = s.number("ib_gbit_s", 400.0, 1e-3, 1e6);
    h.ib_links = static_cast<int>(s.integer("ib_links", 8, 1, 1024));
    h.gpus_per_node = static_cast<int>(s.integer("gpus_per_node", 8, 1, 1024));
    s.finish();
}

void read_plan(Section s, PlanSection& p) {
    p.gpus = static_cast<int>(s.integer("gpus", 0, 0, kMaxRanks));
    s.finish();
}

// --set key.path=value: the value (parsed as YAML) replaces or adds that key in the tree.
void apply_override(YAML::Node root, const std::string& arg, ParseContext& ctx) {
    size_t eq = arg.find('=');
    if (eq == std::string::npos || eq == 0)
        HYMOE_FAIL(Exit::invalid, "--set ", arg, ": expected key.path=value");
    std::string path = arg.substr(0, eq);
    std::vector<std::string> keys;
    std::stringstream in(path);
    for (std::string k; std::getline(in, k, '.');)
        keys.push_back(k);
    YAML::Node value;
    try {
        value = YAML::Load(arg.substr(eq + 1));
    } catch (const YAML::Exception& e) {
        HYMOE_FAIL(
            Exit::invalid, "--set ", arg, ": ", path, ": the value is not YAML (", e.msg, ")");
    }
    YAML::Node node = root;
    for (size_t i = 0; i + 1 < keys.size(); ++i) {
        if (keys[i].empty())
            HYMOE_FAIL(Exit::invalid, "--set ", arg, ": ", path, ": empty key in the path");
        if (!node[keys[i]] || node[keys[i]].IsNull())
            node[keys[i]] = YAML::Node(YAML::NodeType::Map);
        if (!node[keys[i]].IsMap())
            HYMOE_FAIL(
                Exit::invalid, "--set ", arg, ": ", path, ": '", keys[i], "' is not a section");
        YAML::Node next = node[keys[i]];
        node.reset(next);
    }
    node[keys.back()] = value;
    ctx.overrides[path] = "--set " + arg;
}

// YAML forbids tabs in indentation; say so when the failing line or the one before has one.
std::string tab_hint(const std::string& text, int line) {
    std::istringstream in(text);
    std::string s;
    for (int i = 0; std::getline(in, s) && i <= line; ++i)
        if (i >= line - 1 && s.find_first_not_of(" \t") != std::string::npos &&
            s.substr(0, s.find_first_not_of(" \t")).find('\t') != std::string::npos)
            return " (a tab is used for indentation on line " + std::to_string(i + 1) +
                   "; YAML allows only spaces)";
    return "";
}

}  // namespace

std::string read_deck_file(const std::string& path) {
    std::error_code ec;
    if (fs::is_directory(path, ec))
        HYMOE_FAIL(Exit::invalid, path, ": is a folder, expected a deck file (deck.yaml)");
    std::ifstream in(path, std::ios::binary);
    if (!in)
        HYMOE_FAIL(Exit::invalid, path, ": cannot read the deck (", std::strerror(errno), ")");
    std::ostringstream bytes;
    bytes << in.rdbuf();
    return bytes.str();
}

Deck parse_deck(const std::string& text,
                const std::string& path,
                const std::vector<std::string>& overrides) {
    Deck deck;
    deck.path = path;
    deck.dir = fs::path(path).parent_path().string();
    if (deck.dir.empty())
        deck.dir = ".";
    deck.text = text;
    ParseContext ctx{path, deck.dir, {}, &deck.sources};

    YAML::Node root;
    try {
        root = YAML::Load(text);
    } catch (const YAML::ParserException& e) {
        HYMOE_FAIL(Exit::invalid,
                   path,
                   ":",
                   e.mark.line + 1,
                   ":",
                   e.mark.column + 1,
                   ": (yaml): not valid YAML: ",
                   e.msg,
                   tab_hint(text, e.mark.line));
    }
    if (!root.IsDefined() || root.IsNull())
        HYMOE_FAIL(Exit::invalid,
                   path,
                   ":1:1: (deck): the deck is empty (it needs at least job: ",
                   "{kind: ...} and model:)");
    if (!root.IsMap())
        HYMOE_FAIL(Exit::invalid,
                   path,
                   ":",
                   root.Mark().line + 1,
                   ":",
                   root.Mark().column + 1,
                   ": (deck): expected a map of sections (job, model, parallel, ...)");
    for (const auto& o : overrides)
        apply_override(root, o, ctx);

    YAML::Node resolved(YAML::NodeType::Map);
    Section top(ctx, root, resolved, "", root.Mark());
    read_job(top.section("job"), deck.job, deck.dir);
    read_model(top.section("model"), deck.model, deck.job.kind);
    read_parallel(top.section("parallel"), deck.parallel);
    JobKind kind = deck.job.kind;
    if (top.has("finetune")) {
        if (kind == JobKind::infer || kind == JobKind::convert)
            top.fail("finetune",
                     cat("not allowed when job.kind is ",
                         to_string(kind),
                         " (finetune belongs to kind: lora)"));
        read_finetune(top.section("finetune"), deck.finetune);
    } else if (kind == JobKind::lora) {
        top.fail("finetune", "required for a lora job (method, lora, optimizer, data, steps)");
    } else {
        top.allow("finetune");
    }
    if (top.has("inference")) {
        if (kind == JobKind::convert)
            top.fail("inference", "not allowed when job.kind is convert");
        read_inference(top.section("inference"), deck.inference);
    } else if (kind == JobKind::infer) {
        top.fail("inference", "required for an infer job (at least inference.dataset)");
    } else {
        top.allow("inference");
    }
    if (top.has("tokenizer"))
        read_tokenizer(top.section("tokenizer"), deck.tokenizer);
    else if (kind == JobKind::tokenize)
        top.fail("tokenizer", "required for a tokenize job (at least tokenizer.path)");
    else
        top.allow("tokenizer");
    if (top.has("tokenize")) {
        if (kind != JobKind::tokenize)
            top.fail("tokenize", "allowed only when job.kind is tokenize");
        read_tokenize(top.section("tokenize"), deck.tokenize, deck.job.output);
    } else if (kind == JobKind::tokenize) {
        top.fail("tokenize", "required for a tokenize job (at least tokenize.dataset)");
    } else {
        top.allow("tokenize");
    }
    read_profile(top.section("profile"), deck.profile);
    read_hardware(top.section("hardware"), deck.hardware);
    read_plan(top.section("plan"), deck.plan);
    top.finish();

    YAML::Emitter out;
    out << resolved;
    deck.resolved_yaml = out.c_str();
    return deck;
}

std::string Deck::where(const std::string& key_path) const {
    for (std::string p = key_path; !p.empty();) {
        auto it = sources.find(p);
        if (it != sources.end())
            return it->second.where;
        size_t dot = p.rfind('.');
        p = dot == std::string::npos ? std::string() : p.substr(0, dot);
    }
    return path + ":1:1";
}

std::string Deck::locate(const std::string& key_path) const {
    return where(key_path) + ": " + key_path;
}

const char* to_string(JobKind kind) {
    switch (kind) {
        case JobKind::infer:
            return "infer";
        case JobKind::lora:
            return "lora";
        case JobKind::convert:
            return "convert";
        case JobKind::plan:
            return "plan";
        case JobKind::tokenize:
            return "tokenize";
    }
    return "?";
}

const char* to_string(DeviceChoice device) {
    switch (device) {
        case DeviceChoice::automatic:
            return "auto";
        case DeviceChoice::cpu:
            return "cpu";
        case DeviceChoice::cuda:
            return "cuda";
    }
    return "?";
}

}  // namespace hymoe::deck
