// The checked JSON reader behind every config source (config_read.h), the layer/FFN pattern parser
// and the cross-key validation shared by the HF readers, the native reader and the presets.
#include "config_read.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <utility>

#include "hymoe/core/error.h"

namespace hymoe::model::detail {

namespace {

// A JSON value for an error message: `string "2304"`, `number 2.5`, `an array`.
std::string show(const Json& v) {
    if (v.is_array())
        return "an array";
    if (v.is_object())
        return "an object";
    if (v.is_null())
        return "null";
    std::string text = v.dump();
    if (text.size() > 40)
        text = text.substr(0, 37) + "...";
    return cat(v.type_name(), " ", text);
}

std::string join(const std::vector<std::string>& names) {
    std::string out;
    for (size_t i = 0; i < names.size(); ++i)
        out += (i == 0 ? "" : ", ") + names[i];
    return out;
}

}  // namespace

JsonObject::JsonObject(const Json& j, std::string file, std::string prefix)
    : j_(j), file_(std::move(file)), prefix_(std::move(prefix)) {}

std::string JsonObject::path(const std::string& key) const {
    return prefix_.empty() ? key : prefix_ + "." + key;
}

bool JsonObject::has(const std::string& key) const {
    seen_.insert(key);
    auto it = j_.find(key);
    return it != j_.end() && !it->is_null();
}

void JsonObject::fail(const std::string& key, const std::string& what) const {
    HYMOE_FAIL(Exit::invalid, file_, ": ", path(key), ": ", what);
}

const Json& JsonObject::require(const std::string& key) const {
    seen_.insert(key);
    auto it = j_.find(key);
    if (it == j_.end())
        fail(key, "required key is missing");
    if (it->is_null())
        fail(key, "is null, but a value is required");
    return *it;
}

int64_t JsonObject::to_int64(const std::string& key, const Json& v, int64_t lo, int64_t hi) const {
    int64_t x = 0;
    if (v.is_number_unsigned()) {
        uint64_t u = v.get<uint64_t>();
        if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
            fail(key, cat("must be at most ", hi, ", got ", u));
        x = static_cast<int64_t>(u);
    } else if (v.is_number_integer()) {
        x = v.get<int64_t>();
    } else if (v.is_number_float()) {
        double d = v.get<double>();
        if (d != std::floor(d) || std::fabs(d) > 9.0e18)
            fail(key, cat("expected an integer, got ", show(v)));
        x = static_cast<int64_t>(d);
    } else {
        fail(key, cat("expected an integer, got ", show(v)));
    }
    if (x < lo)
        fail(key, cat("must be at least ", lo, ", got ", x));
    if (x > hi)
        fail(key, cat("must be at most ", hi, ", got ", x));
    return x;
}

int JsonObject::get_int(const std::string& key, int64_t lo, int64_t hi) const {
    return static_cast<int>(to_int64(key, require(key), lo, std::min(hi, int_max)));
}

int64_t JsonObject::get_int64(const std::string& key, int64_t lo, int64_t hi) const {
    return to_int64(key, require(key), lo, hi);
}

double JsonObject::get_double(const std::string& key, double lo, double hi) const {
    const Json& v = require(key);
    if (!v.is_number())
        fail(key, cat("expected a number, got ", show(v)));
    double x = v.get<double>();
    if (x < lo)
        fail(key,
             lo == positive ? cat("must be positive, got ", x)
                            : cat("must be at least ", lo, ", got ", x));
    if (x > hi)
        fail(key, cat("must be at most ", hi, ", got ", x));
    return x;
}

bool JsonObject::get_bool(const std::string& key) const {
    const Json& v = require(key);
    if (!v.is_boolean())
        fail(key, cat("expected true or false, got ", show(v)));
    return v.get<bool>();
}

std::string JsonObject::get_string(const std::string& key) const {
    const Json& v = require(key);
    if (!v.is_string())
        fail(key, cat("expected a string, got ", show(v)));
    return v.get<std::string>();
}

std::vector<int64_t> JsonObject::get_int_list(const std::string& key,
                                              int64_t lo,
                                              int64_t hi) const {
    const Json& v = require(key);
    if (!v.is_array())
        fail(key, cat("expected a list of integers, got ", show(v)));
    std::vector<int64_t> out;
    for (size_t i = 0; i < v.size(); ++i)
        out.push_back(to_int64(cat(key, "[", i, "]"), v[i], lo, hi));
    return out;
}

JsonObject JsonObject::get_object(const std::string& key) const {
    const Json& v = require(key);
    if (!v.is_object())
        fail(key, cat("expected an object, got ", show(v)));
    return JsonObject(v, file_, path(key));
}

int JsonObject::opt_int(const std::string& key, int fallback, int64_t lo, int64_t hi) const {
    return has(key) ? get_int(key, lo, hi) : fallback;
}

int64_t JsonObject::opt_int64(const std::string& key,
                              int64_t fallback,
                              int64_t lo,
                              int64_t hi) const {
    return has(key) ? get_int64(key, lo, hi) : fallback;
}

double JsonObject::opt_double(const std::string& key, double fallback, double lo, double hi) const {
    return has(key) ? get_double(key, lo, hi) : fallback;
}

bool JsonObject::opt_bool(const std::string& key, bool fallback) const {
    return has(key) ? get_bool(key) : fallback;
}

std::string JsonObject::opt_string(const std::string& key, const std::string& fallback) const {
    return has(key) ? get_string(key) : fallback;
}

int JsonObject::get_choice(const std::string& key, const std::vector<std::string>& names) const {
    std::string s = get_string(key);
    for (size_t i = 0; i < names.size(); ++i)
        if (names[i] == s)
            return static_cast<int>(i);
    fail(key, cat("expected one of ", join(names), ", got \"", s, "\""));
}

int JsonObject::opt_choice(const std::string& key,
                           const std::vector<std::string>& names,
                           int fallback) const {
    return has(key) ? get_choice(key, names) : fallback;
}

void JsonObject::reject_unknown() const {
    for (const auto& item : j_.items())
        if (!seen_.count(item.key()))
            fail(item.key(),
                 cat("unknown key (known here: ",
                     join(std::vector<std::string>(seen_.begin(), seen_.end())),
                     ")"));
}

Json parse_json_object(const std::string& text, const std::string& where) {
    Json j;
    try {
        j = Json::parse(text);
    } catch (const Json::exception& e) {  // parse_error, or out_of_range: a number overflows
        std::string msg = e.what();
        auto pos = msg.find("] ");  // drop nlohmann's "[json.exception.parse_error.101] " tag
        if (msg.rfind("[json.exception", 0) == 0 && pos != std::string::npos)
            msg = msg.substr(pos + 2);
        HYMOE_FAIL(Exit::invalid, where, ": not valid JSON (", msg, ")");
    }
    if (!j.is_object())
        HYMOE_FAIL(Exit::invalid, where, ": the top level must be a JSON object, got ", show(j));
    return j;
}

void read_rope_scaling(const JsonObject& obj, const std::string& key, MlaConfig& mla, bool strict) {
    mla.rope_scaling = RopeScaling::none;
    mla.softmax_scale = SoftmaxScale::plain;
    if (!obj.has(key))
        return;
    JsonObject rs = obj.get_object(key);
    // HF writes "type" (older) or "rope_type" (newer); "default" means no scaling.
    bool has_rope_type = rs.has("rope_type");
    std::string type =
        rs.has("type") ? rs.get_string("type") : (has_rope_type ? rs.get_string("rope_type") : "");
    if (type.empty())
        rs.fail("type", "required key is missing (rope_scaling needs a type, e.g. \"yarn\")");
    if (type == "default") {
        if (strict)
            rs.reject_unknown();
        return;
    }
    if (type != "yarn")
        rs.fail(rs.has("type") ? "type" : "rope_type",
                cat("unsupported RoPE scaling \"", type, "\" (hymoe implements yarn)"));
    mla.rope_scaling = RopeScaling::yarn;
    mla.yarn_factor = rs.get_double("factor", 1.0);
    mla.yarn_original_max_position = rs.get_int64("original_max_position_embeddings", 1, int_max);
    mla.yarn_beta_fast = rs.opt_double("beta_fast", 32.0, positive);
    mla.yarn_beta_slow = rs.opt_double("beta_slow", 1.0, positive);
    mla.yarn_mscale = rs.opt_double("mscale", 1.0, 0.0);
    mla.yarn_mscale_all_dim = rs.opt_double("mscale_all_dim", 0.0, 0.0);
    if (mla.yarn_beta_fast <= mla.yarn_beta_slow)
        rs.fail("beta_fast",
                cat("must be larger than beta_slow (",
                    mla.yarn_beta_slow,
                    "), got ",
                    mla.yarn_beta_fast));
    if (strict)
        rs.reject_unknown();
    // HF DeepseekV3Attention: softmax_scale *= yarn_get_mscale(factor, mscale_all_dim)² when
    // mscale_all_dim is set; DS32's own code does the same with its `mscale` argument.
    if (mla.yarn_mscale_all_dim > 0.0)
        mla.softmax_scale = SoftmaxScale::yarn;
}

void apply_patterns(ModelConfig& cfg,
                    const std::string& layers,
                    const std::string& ffns,
                    const std::string& where,
                    const std::string& layer_key,
                    const std::string& ffn_key) {
    auto fail = [&](const std::string& key, const std::string& what) {
        HYMOE_FAIL(Exit::invalid, where, ": ", key, ": ", what);
    };
    // Letters (whitespace ignored) and the layer index after each '|'.
    auto parse = [&](const std::string& text, const std::string& key, const std::string& letters) {
        std::pair<std::string, std::vector<int>> out;
        for (size_t i = 0; i < text.size(); ++i) {
            char ch = text[i];
            int n = static_cast<int>(out.first.size());
            if (ch == ' ' || ch == '\t' || ch == '\n')
                continue;
            if (ch == '|') {
                if (n == 0)
                    fail(key, "a stage boundary '|' cannot come before the first layer");
                if (!out.second.empty() && out.second.back() == n)
                    fail(key, cat("stage boundaries '|' at character ", i, " enclose no layer"));
                out.second.push_back(n);
            } else if (letters.find(ch) != std::string::npos) {
                out.first += ch;
            } else {
                fail(key,
                     cat("unknown letter '",
                         ch,
                         "' at character ",
                         i,
                         " (expected one of ",
                         letters,
                         ", '|' or spaces)"));
            }
        }
        if (out.first.empty())
            fail(key, "the pattern has no layers");
        if (!out.second.empty() && out.second.back() == static_cast<int>(out.first.size()))
            fail(key, "a stage boundary '|' cannot come after the last layer");
        return out;
    };
    auto [mix, stages] = parse(layers, layer_key, "KMADG");
    auto [ffn, ffn_stages] = parse(ffns, ffn_key, "-EL");
    if (ffn.size() != mix.size())
        fail(ffn_key, cat("has ", ffn.size(), " layers but ", layer_key, " has ", mix.size()));
    if (!ffn_stages.empty() && ffn_stages != stages)
        fail(ffn_key, cat("its stage boundaries '|' differ from those of ", layer_key));
    cfg.layers.clear();
    for (size_t i = 0; i < mix.size(); ++i) {
        LayerSpec s;
        char m = mix[i];
        s.mixer = m == 'K' ? Mixer::kda : (m == 'M' || m == 'A') ? Mixer::mla : Mixer::dsa;
        s.gated = m == 'A' || m == 'G';
        s.ffn = ffn[i] == '-' ? Ffn::dense : ffn[i] == 'E' ? Ffn::moe : Ffn::latent_moe;
        cfg.layers.push_back(s);
    }
    cfg.stage_boundaries = stages;
}

// ---- validation ------------------------------------------------------------------------------

const KeyNames native_keys = {
    "layer_pattern",        "intermediate_size",
    "kda.n_head",           "kda.head_dim",
    "kda.conv_kernel",      "mla.n_head",
    "mla.q_lora_rank",      "mla.kv_lora_rank",
    "mla.qk_nope_head_dim", "mla.qk_rope_head_dim",
    "mla.v_head_dim",       "indexer.n_head",
    "indexer.head_dim",     "indexer.top_k",
    "moe.n_routed_experts", "moe.top_k",
    "moe.intermediate",     "moe.shared_intermediate",
    "moe.latent_size",      "moe.n_group",
    "moe.topk_group",       "moe.weights_from_biased_scores",
    "bos_token_id",         "eos_token_id",
    "pad_token_id",
};

const KeyNames kimi_keys = {
    "num_hidden_layers",
    "intermediate_size",
    "linear_attn_config.num_heads",
    "linear_attn_config.head_dim",
    "linear_attn_config.short_conv_kernel_size",
    "num_attention_heads",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
    "(indexer: kimi_linear has no DSA layers)",
    "(indexer: kimi_linear has no DSA layers)",
    "(indexer: kimi_linear has no DSA layers)",
    "num_experts",
    "num_experts_per_token",
    "moe_intermediate_size",
    "num_shared_experts",
    "(latent size: kimi_linear has no latent MoE)",
    "num_expert_group",
    "topk_group",
    "(weights_from_biased_scores)",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
};

const KeyNames deepseek_keys = {
    "num_hidden_layers",
    "intermediate_size",
    "(kda: deepseek_v32 has no KDA layers)",
    "(kda: deepseek_v32 has no KDA layers)",
    "(kda: deepseek_v32 has no KDA layers)",
    "num_attention_heads",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
    "index_n_heads",
    "index_head_dim",
    "index_topk",
    "n_routed_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "n_shared_experts",
    "(latent size: deepseek_v32 has no latent MoE)",
    "n_group",
    "topk_group",
    "(weights_from_biased_scores)",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
};

namespace {

[[noreturn]] void fail_at(const std::string& where,
                          const std::string& key,
                          const std::string& what) {
    HYMOE_FAIL(Exit::invalid, where, ": ", key, ": ", what);
}

void check_min(const std::string& where, const char* key, int64_t value, int64_t lo) {
    if (value < lo)
        fail_at(where, key, cat("must be at least ", lo, ", got ", value));
}

}  // namespace

void validate(const ModelConfig& cfg, const std::string& where, const KeyNames& k) {
    const int n = static_cast<int>(cfg.layers.size());
    if (n == 0)
        fail_at(where, k.layers, "the model has no layers");
    check_min(where, "vocab_size", cfg.vocab_size, 1);
    check_min(where, "hidden_size", cfg.hidden_size, 1);
    check_min(where, "max_position_embeddings", cfg.max_position, 1);
    if (!(cfg.rms_norm_eps > 0.0))
        fail_at(where, "rms_norm_eps", cat("must be positive, got ", cfg.rms_norm_eps));
    for (size_t i = 0; i < cfg.stage_boundaries.size(); ++i) {
        int b = cfg.stage_boundaries[i];
        int prev = i == 0 ? 0 : cfg.stage_boundaries[i - 1];
        if (b <= prev || b >= n)
            fail_at(
                where,
                k.layers,
                cat("stage boundary ", i, " at layer ", b, " is not inside (", prev, ", ", n, ")"));
    }
    int kda = 0, mla = 0, dsa = 0, dense = 0, moe = 0, latent = 0;
    for (int i = 0; i < n; ++i) {
        const LayerSpec& s = cfg.layers[i];
        kda += s.mixer == Mixer::kda;
        mla += s.mixer == Mixer::mla || s.mixer == Mixer::dsa;
        dsa += s.mixer == Mixer::dsa;
        dense += s.ffn == Ffn::dense;
        moe += s.ffn == Ffn::moe || s.ffn == Ffn::latent_moe;
        latent += s.ffn == Ffn::latent_moe;
        if (s.mixer == Mixer::kda && s.gated)
            fail_at(where, k.layers, cat("layer ", i, " is KDA, which takes no extra output gate"));
    }
    if (dense > 0)
        check_min(where, k.intermediate_size, cfg.intermediate_size, 1);
    if (kda > 0) {
        check_min(where, k.kda_n_head, cfg.kda.n_head, 1);
        check_min(where, k.kda_head_dim, cfg.kda.head_dim, 1);
        check_min(where, k.kda_conv_kernel, cfg.kda.conv_kernel, 1);
    }
    if (mla > 0) {
        const MlaConfig& a = cfg.mla;
        check_min(where, k.mla_n_head, a.n_head, 1);
        check_min(where, k.mla_q_lora_rank, a.q_lora_rank, 0);
        check_min(where, k.mla_kv_lora_rank, a.kv_lora_rank, 1);
        check_min(where, k.mla_qk_nope_head_dim, a.qk_nope_head_dim, 0);
        check_min(where, k.mla_qk_rope_head_dim, a.qk_rope_head_dim, 0);
        check_min(where, k.mla_v_head_dim, a.v_head_dim, 1);
        if (a.qk_nope_head_dim + a.qk_rope_head_dim < 1)
            fail_at(
                where, k.mla_qk_nope_head_dim, "query/key heads have no dims (nope + rope = 0)");
        if (a.qk_rope_head_dim % 2 != 0)
            fail_at(where,
                    k.mla_qk_rope_head_dim,
                    cat("must be even (RoPE rotates pairs), got ", a.qk_rope_head_dim));
    }
    if (dsa > 0) {
        if (cfg.mla.q_lora_rank < 1)
            fail_at(where,
                    k.mla_q_lora_rank,
                    "DSA layers need a query latent (the indexer reads c_q), got 0");
        check_min(where, k.indexer_n_head, cfg.indexer.n_head, 1);
        check_min(where, k.indexer_head_dim, cfg.indexer.head_dim, 1);
        check_min(where, k.indexer_top_k, cfg.indexer.top_k, 1);
        if (cfg.indexer.head_dim < cfg.mla.qk_rope_head_dim)
            fail_at(where,
                    k.indexer_head_dim,
                    cat("must be at least qk_rope_head_dim (",
                        cfg.mla.qk_rope_head_dim,
                        ": the indexer ropes its first d_r dims), got ",
                        cfg.indexer.head_dim));
    }
    if (moe > 0) {
        const MoeConfig& m = cfg.moe;
        check_min(where, k.moe_n_routed_experts, m.n_routed_experts, 1);
        check_min(where, k.moe_top_k, m.top_k, 1);
        check_min(where, k.moe_intermediate, m.moe_intermediate, 1);
        check_min(where, k.moe_n_group, m.n_group, 1);
        check_min(where, k.moe_topk_group, m.topk_group, 1);
        if (m.top_k > m.n_routed_experts)
            fail_at(where,
                    k.moe_top_k,
                    cat("must be at most the ",
                        m.n_routed_experts,
                        " routed experts (",
                        k.moe_n_routed_experts,
                        "), got ",
                        m.top_k));
        if (m.n_routed_experts % m.n_group != 0)
            fail_at(where,
                    k.moe_n_group,
                    cat(m.n_group, " groups do not divide the ", m.n_routed_experts, " experts"));
        if (m.topk_group > m.n_group)
            fail_at(where,
                    k.moe_topk_group,
                    cat("must be at most the ", m.n_group, " groups, got ", m.topk_group));
        int reachable = m.topk_group * (m.n_routed_experts / m.n_group);
        if (m.top_k > reachable)
            fail_at(where,
                    k.moe_top_k,
                    cat("must be at most the ",
                        reachable,
                        " experts of the kept groups (topk_group x experts per group), got ",
                        m.top_k));
        if (m.n_shared_experts < 0)
            fail_at(where, k.moe_shared_intermediate, "the shared-expert count is negative");
        if (m.n_shared_experts > 0 && m.shared_intermediate < 1)
            fail_at(where,
                    k.moe_shared_intermediate,
                    cat("must be positive with ", m.n_shared_experts, " shared experts"));
        if (m.n_shared_experts == 0 && m.shared_intermediate != 0)
            fail_at(where, k.moe_shared_intermediate, "must be 0 without shared experts");
        if (m.weights_from_biased_scores && !m.correction_bias)
            fail_at(where,
                    k.moe_weights_from_biased_scores,
                    "needs the correction bias (moe.correction_bias: true)");
        if (!(m.routed_scaling_factor > 0.0))
            fail_at(where, "routed_scaling_factor", "must be positive");
        if (!(m.capacity_factor >= 0.0))
            fail_at(where, "capacity_factor", "must be 0 (dropless) or positive");
    }
    if (latent > 0)
        check_min(where, k.moe_latent_size, cfg.moe.latent_size, 1);
    const std::pair<const char*, int64_t> ids[] = {
        {k.bos_id, cfg.bos_id}, {k.eos_id, cfg.eos_id}, {k.pad_id, cfg.pad_id}};
    for (const auto& [key, id] : ids)
        if (id < -1 || id >= cfg.vocab_size)
            fail_at(where,
                    key,
                    cat("token id ",
                        id,
                        " is outside the vocabulary [0, ",
                        cfg.vocab_size,
                        ") (-1 = none)"));
    const VisionConfig& v = cfg.vision;
    if (v.present) {
        check_min(where, "vision.patch_size", v.patch_size, 1);
        check_min(where, "vision.merge", v.merge, 1);
        check_min(where, "vision.width", v.width, 1);
        check_min(where, "vision.n_layer", v.n_layer, 1);
        check_min(where, "vision.n_head", v.n_head, 1);
        check_min(where, "vision.mlp", v.mlp, 1);
        check_min(where, "vision.pos_emb_size", v.pos_emb_size, 1);
        if (v.width % v.n_head != 0 || (v.width / v.n_head) % 4 != 0)
            fail_at(where,
                    "vision.n_head",
                    cat("width / n_head must be a multiple of 4 (2-D RoPE), got ",
                        v.width,
                        " / ",
                        v.n_head));
        if (v.media_token_id < 0 || v.media_token_id >= cfg.vocab_size)
            fail_at(where,
                    "vision.media_token_id",
                    cat("token id ",
                        v.media_token_id,
                        " is outside the vocabulary [0, ",
                        cfg.vocab_size,
                        ")"));
    }
}

}  // namespace hymoe::model::detail
