// The deck parser: each section read through the schema table (schema.cpp: every key's type,
// default, range and meaning), the cross-key rules that need no model or MPI, and --set overrides.
#include <cerrno>
#include <charconv>
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

namespace {

DType parse_dtype(const std::string& s) {
    return s == "bf16" ? DType::bf16 : s == "fp16" ? DType::f16 : DType::f32;
}

void read_job(Section s, JobSection& job, const std::string& deck_dir) {
    std::string kind = s.choice("kind");
    job.kind = kind == "infer"     ? JobKind::infer
               : kind == "lora"    ? JobKind::lora
               : kind == "convert" ? JobKind::convert
               : kind == "plan"    ? JobKind::plan
                                   : JobKind::tokenize;
    std::string folder = fs::absolute(deck_dir).lexically_normal().filename().string();
    job.name = s.text("name", folder.empty() ? std::string("job") : folder);
    job.seed = static_cast<uint64_t>(s.integer("seed"));
    std::string out = s.text("output");
    job.output = (fs::path(out).is_relative() ? fs::path(deck_dir) / out : fs::path(out))
                     .lexically_normal()
                     .string();
    std::string device = s.choice("device");
    job.device = device == "cpu"    ? DeviceChoice::cpu
                 : device == "cuda" ? DeviceChoice::cuda
                                    : DeviceChoice::automatic;
    job.device_memory = s.number("device_memory");
    job.max_hours = s.number("max_hours");
    job.overwrite = s.flag("overwrite");
    s.finish();
}

void read_model(Section s, ModelSection& m, JobKind kind) {
    bool has_preset = s.has("preset"), has_config = s.has("config");
    if (has_preset && has_config)
        s.fail("config", "give either model.preset or model.config, not both");
    if (!has_preset && !has_config)
        s.fail("preset", "required: either model.preset (a built-in name) or model.config");
    m.preset = s.text("preset");
    m.config = s.path("config");
    m.weights = s.path("weights");
    m.init_random = s.choice("init") == "random";
    const bool has_weights = !m.weights.empty();
    if (has_weights && m.init_random)
        s.fail("init", "give either model.weights or model.init: random, not both");
    bool needs_weights = kind != JobKind::plan && kind != JobKind::tokenize;
    if (needs_weights && !has_weights && !m.init_random)
        s.fail("weights",
               "required for this job kind: model.weights (a folder) or model.init: random");
    if (kind == JobKind::convert && !has_weights)
        s.fail("weights", "a convert job needs model.weights (the safetensors folder to convert)");
    m.dtype = parse_dtype(s.choice("dtype"));
    s.finish();
}

void read_parallel(Section s, ParallelSection& p) {
    p.tp = static_cast<int>(s.integer("tp"));
    p.pp = static_cast<int>(s.integer("pp"));
    p.dp = static_cast<int>(s.integer("dp"));
    p.ep = static_cast<int>(s.integer("ep"));
    p.etp = static_cast<int>(s.integer("etp"));
    p.rebalance_every = s.integer("rebalance_every");
    s.finish();
}

void read_finetune(Section s, FinetuneSection& f) {
    f.present = true;
    f.method = s.choice("method");
    f.base_dtype = parse_dtype(s.choice("base_dtype"));
    {
        Section l = s.section("lora");
        f.lora.rank = static_cast<int>(l.integer("rank"));
        f.lora.alpha = l.number("alpha", 2.0 * f.lora.rank);
        f.lora.dropout = l.number("dropout");
        f.lora.target_modules = l.list("target_modules");
        if (f.lora.target_modules.empty())
            f.lora.target_modules = {"q_proj", "k_proj", "v_proj", "o_proj"};
        f.lora.rslora = l.flag("rslora");
        f.lora.per_expert = l.choice("expert_adapters") == "per_expert";
        l.finish();
    }
    {
        Section o = s.section("optimizer");
        OptimizerSection& opt = f.optimizer;
        opt.lr = o.number("lr");
        opt.scheduler = o.choice("scheduler");
        opt.warmup_steps = static_cast<int>(o.integer("warmup_steps"));
        opt.min_lr_ratio = o.number("min_lr_ratio");
        opt.weight_decay = o.number("weight_decay");
        opt.grad_clip = o.number("grad_clip");
        opt.beta1 = o.number("beta1");
        opt.beta2 = o.number("beta2");
        opt.eps = o.number("eps");
        o.finish();
    }
    {
        Section d = s.section("data");
        f.domain_data = d.path("domain");
        f.general_data = d.path("general");
        f.domain_ratio = d.number("domain_ratio", f.general_data.empty() ? 1.0 : 0.8);
        f.general_ratio = d.number("general_ratio", 1.0 - f.domain_ratio);
        if (std::abs(f.domain_ratio + f.general_ratio - 1.0) > 1e-9)
            d.fail("general_ratio",
                   cat("domain_ratio + general_ratio = ",
                       f.domain_ratio + f.general_ratio,
                       " (they must sum to 1)"));
        if (f.general_ratio > 0 && f.general_data.empty())
            d.fail("general_ratio", "is above 0 but finetune.data.general is not given");
        d.finish();
    }
    f.steps = static_cast<int>(s.integer("steps"));
    {
        Section b = s.section("batch");
        f.micro_batch = static_cast<int>(b.integer("micro_batch"));
        f.seq_len = static_cast<int>(b.integer("seq_len"));
        f.grad_accum = static_cast<int>(b.integer("grad_accum"));
        b.finish();
    }
    {
        Section e = s.section("eval");
        f.eval_every = static_cast<int>(e.integer("every"));
        f.eval_domain = e.path("domain");
        f.eval_general = e.path("general");
        f.eval_batches = static_cast<int>(e.integer("batches"));
        if (f.eval_every > 0 && f.eval_domain.empty() && f.eval_general.empty())
            e.fail("every", "evaluation asked for, but neither eval.domain nor eval.general given");
        f.eval_metric = e.choice(
            "metric",
            f.eval_domain.empty() && !f.eval_general.empty() ? "general_loss" : "domain_loss");
        if (f.eval_every > 0 &&
            (f.eval_metric == "domain_loss" ? f.eval_domain.empty() : f.eval_general.empty()))
            e.fail("metric",
                   cat(f.eval_metric,
                       " needs eval.",
                       f.eval_metric == "domain_loss" ? "domain" : "general",
                       ", which is not given"));
        e.finish();
    }
    {
        Section c = s.section("checkpoint");
        f.checkpoint_every = static_cast<int>(c.integer("every"));
        f.checkpoint_keep = static_cast<int>(c.integer("keep"));
        f.checkpoint_best = c.flag("best");
        c.finish();
    }
    {
        Section es = s.section("early_stopping");
        f.early_stopping_patience = static_cast<int>(es.integer("patience"));
        f.early_stopping_min_delta = es.number("min_delta");
        if (f.early_stopping_patience > 0 && f.eval_every == 0)
            es.fail("patience", "early stopping needs evaluations (finetune.eval.every > 0)");
        es.finish();
    }
    f.log_every = static_cast<int>(s.integer("log_every"));
    f.recompute = s.flag("recompute");
    f.on_nonfinite = s.choice("on_nonfinite");
    f.loss_spike = s.number("loss_spike");
    f.export_merged = s.flag("export_merged");
    s.finish();
}

void read_inference(Section s, InferenceSection& in, DType model_dtype) {
    in.present = true;
    in.dataset = s.path("dataset");
    in.adapters = s.path_map("adapters");
    in.max_new_tokens = static_cast<int>(s.integer("max_new_tokens"));
    in.prompt_logprobs = s.flag("prompt_logprobs");
    in.logprobs = static_cast<int>(s.integer("logprobs"));
    in.on_bad_request = s.choice("on_bad_request");
    in.batch_invariant = s.flag("batch_invariant");
    in.shards = s.integer("shards");
    in.shard = s.integer("shard");
    if (in.shard >= in.shards)
        s.fail("shard", cat(in.shard, " is not below inference.shards = ", in.shards));
    {
        Section p = s.section("sampling");
        in.temperature = p.number("temperature");
        in.top_p = p.number("top_p");
        in.top_k = static_cast<int>(p.integer("top_k"));
        in.min_p = p.number("min_p");
        in.presence_penalty = p.number("presence_penalty");
        in.frequency_penalty = p.number("frequency_penalty");
        in.repetition_penalty = p.number("repetition_penalty");
        in.stop = p.list("stop");
        for (const std::string& id : p.list("stop_token_ids")) {
            int64_t v = -1;
            const char* end = id.data() + id.size();
            if (auto [at, ec] = std::from_chars(id.data(), end, v);
                ec != std::errc() || at != end || v < 0 || v > int64_t{1} << 24)
                p.fail("stop_token_ids", "'" + id + "' is not a token id (0 to 16777216)");
            in.stop_token_ids.push_back(v);
        }
        in.n = static_cast<int>(p.integer("n"));
        p.finish();
    }
    {
        Section b = s.section("batch");
        in.max_tokens = static_cast<int>(b.integer("max_tokens"));
        in.max_seqs = static_cast<int>(b.integer("max_seqs"));
        in.prefill_chunk = static_cast<int>(b.integer("prefill_chunk"));
        if (in.prefill_chunk > in.max_tokens)
            b.fail("prefill_chunk",
                   cat(in.prefill_chunk, " is larger than batch.max_tokens = ", in.max_tokens));
        b.finish();
    }
    {
        Section k = s.section("kv_cache");
        in.page_tokens = static_cast<int>(k.integer("page_tokens"));
        in.pages = k.integer_or_auto("pages");
        in.offload = k.choice("offload");
        in.offload_path = k.path("offload_path");
        const char* model_dtype_name = model_dtype == DType::bf16  ? "bf16"
                                       : model_dtype == DType::f16 ? "fp16"
                                                                   : "fp32";
        in.kv_dtype = parse_dtype(k.choice("dtype", model_dtype_name));
        k.finish();
    }
    {
        Section pc = s.section("prefix_cache");
        in.prefix_cache = pc.flag("enabled");
        in.prefix_cache_bytes = pc.integer("max_bytes");
        pc.finish();
    }
    {
        Section im = s.section("images");
        in.image_max_patches = im.integer("max_patches");
        in.image_max_pixels = im.integer("max_pixels");
        in.image_pool = static_cast<int>(im.integer("pool"));
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
    t.path = s.path("path");
    t.pattern = s.text("pattern");
    t.chat = s.choice("chat");
    text::ChatTemplate& c = t.chat_template;
    if (t.chat == "template") {
        for (const char* key : {"bos", "roles", "generation_prefix"})
            if (s.has(key))
                s.fail(key,
                       "not with tokenizer.chat: template (the model's chat_template writes it)");
        const fs::path dir =
            fs::is_directory(t.path) ? fs::path(t.path) : fs::path(t.path).parent_path();
        try {
            c = text::load_hf_chat_template(dir.string());
        } catch (const Error& e) {
            s.fail("chat", e.what());
        }
        s.finish();
        return;
    }
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
    t.dataset = s.path("dataset");
    const std::string out = s.text("output");
    t.output = (fs::path(out).is_relative() ? fs::path(output_dir) / out : fs::path(out))
                   .lexically_normal()
                   .string();
    t.eos = s.text("eos");
    t.max_line_bytes = s.integer("max_line_bytes");
    t.on_bad_request = s.choice("on_bad_request");
    t.chunk_lines = s.integer("chunk_lines");
    s.finish();
}

void read_profile(Section s, ProfileSection& p) {
    p.layers = s.flag("layers");
    p.experts = s.flag("experts");
    s.finish();
}

void read_hardware(Section s, HardwareSection& h) {
    h.gpu_memory_gb = s.number("gpu_memory_gb");
    h.hbm_tb_s = s.number("hbm_tb_s");
    h.tflops = s.number("tflops");
    h.nvlink_gb_s = s.number("nvlink_gb_s");
    h.ib_gbit_s = s.number("ib_gbit_s");
    h.ib_links = static_cast<int>(s.integer("ib_links"));
    h.gpus_per_node = static_cast<int>(s.integer("gpus_per_node"));
    s.finish();
}

void read_plan(Section s, PlanSection& p) {
    p.gpus = static_cast<int>(s.integer("gpus"));
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
    // a value for a whole section replaces what earlier --set gave inside it
    for (auto it = ctx.overrides.lower_bound(path + ".");
         it != ctx.overrides.end() && it->first.rfind(path + ".", 0) == 0;)
        it = ctx.overrides.erase(it);
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
    deck.inference.kv_dtype = deck.model.dtype;  // a plan job without inference: the default
    if (top.has("inference")) {
        if (kind == JobKind::convert)
            top.fail("inference", "not allowed when job.kind is convert");
        read_inference(top.section("inference"), deck.inference, deck.model.dtype);
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
