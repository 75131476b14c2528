// ModelConfig entry points: load/parse (dispatch on model_type), the native hymoe reader and
// writer, parameter counts from the weight shapes of model-math §3-8, and the log summary.
// The HF readers live in config_hf.cpp, the presets in config_presets.cpp, the checked JSON reader
// and the shared validation in config_read.cpp.
#include "hymoe/model/config.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "config_read.h"
#include "hymoe/core/error.h"

namespace hymoe::model {

using detail::Json;
using detail::JsonObject;

const char* to_string(Mixer mixer) {
    switch (mixer) {
        case Mixer::kda:
            return "kda";
        case Mixer::mla:
            return "mla";
        case Mixer::dsa:
            return "dsa";
    }
    return "?";
}

const char* to_string(Ffn ffn) {
    switch (ffn) {
        case Ffn::dense:
            return "dense";
        case Ffn::moe:
            return "moe";
        case Ffn::latent_moe:
            return "latent_moe";
    }
    return "?";
}

const char* to_string(Scoring scoring) {
    return scoring == Scoring::sigmoid ? "sigmoid" : "softmax";
}

const char* to_string(DropPolicy policy) {
    return policy == DropPolicy::probs ? "probs" : "position";
}

const char* to_string(ExpertAct act) {
    return act == ExpertAct::swiglu ? "swiglu" : "relu2";
}

double mla_softmax_scale(const MlaConfig& mla) {
    double tau = 1.0 / std::sqrt(static_cast<double>(mla.qk_nope_head_dim + mla.qk_rope_head_dim));
    if (mla.softmax_scale == SoftmaxScale::yarn && mla.yarn_factor > 1.0) {
        double m = 0.1 * mla.yarn_mscale_all_dim * std::log(mla.yarn_factor) + 1.0;
        tau *= m * m;
    }
    return tau;
}

int count_layers(const ModelConfig& cfg, Mixer mixer) {
    int n = 0;
    for (const LayerSpec& s : cfg.layers)
        n += s.mixer == mixer;
    return n;
}

int count_layers(const ModelConfig& cfg, Ffn ffn) {
    int n = 0;
    for (const LayerSpec& s : cfg.layers)
        n += s.ffn == ffn;
    return n;
}

namespace {

// Letters in groups of 4 from each stage start, " | " between stages.
template <typename Letter>
std::string pattern(const ModelConfig& cfg, Letter letter) {
    std::string out;
    size_t stage = 0;
    int in_stage = 0;
    for (int i = 0; i < static_cast<int>(cfg.layers.size()); ++i) {
        if (stage < cfg.stage_boundaries.size() && cfg.stage_boundaries[stage] == i) {
            out += " | ";
            ++stage;
            in_stage = 0;
        } else if (in_stage > 0 && in_stage % 4 == 0) {
            out += ' ';
        }
        out += letter(cfg.layers[i]);
        ++in_stage;
    }
    return out;
}

}  // namespace

std::string layer_pattern(const ModelConfig& cfg) {
    return pattern(cfg, [](const LayerSpec& s) {
        switch (s.mixer) {
            case Mixer::kda:
                return 'K';
            case Mixer::mla:
                return s.gated ? 'A' : 'M';
            case Mixer::dsa:
                return s.gated ? 'G' : 'D';
        }
        return '?';
    });
}

std::string ffn_pattern(const ModelConfig& cfg) {
    return pattern(cfg, [](const LayerSpec& s) {
        switch (s.ffn) {
            case Ffn::dense:
                return '-';
            case Ffn::moe:
                return 'E';
            case Ffn::latent_moe:
                return 'L';
        }
        return '?';
    });
}

// ---- native hymoe reader (keys: docs/model-config.md) ----------------------------------------

namespace detail {

namespace {

KdaConfig read_kda(const JsonObject& o) {
    KdaConfig k;
    k.n_head = o.get_int("n_head", 1);
    k.head_dim = o.get_int("head_dim", 1);
    k.conv_kernel = o.opt_int("conv_kernel", 4, 1);
    if (o.has("gate_lower_bound")) {
        double lb = o.get_double("gate_lower_bound", -inf, 0.0);
        if (lb == 0.0)
            o.fail("gate_lower_bound", "must be negative (or null for the plain gate), got 0");
        k.gate_lower_bound = lb;
    }
    o.reject_unknown();
    return k;
}

MlaConfig read_mla(const JsonObject& o) {
    MlaConfig a;
    a.n_head = o.get_int("n_head", 1);
    a.q_lora_rank = o.opt_int("q_lora_rank", 0, 0);
    a.kv_lora_rank = o.get_int("kv_lora_rank", 1);
    a.qk_nope_head_dim = o.get_int("qk_nope_head_dim", 0);
    a.qk_rope_head_dim = o.get_int("qk_rope_head_dim", 0);
    a.v_head_dim = o.get_int("v_head_dim", 1);
    a.nope = o.opt_bool("nope", false);
    a.rope_theta = o.opt_double("rope_theta", 10000.0, positive);
    read_rope_scaling(o, "rope_scaling", a, true);
    a.softmax_scale = static_cast<SoftmaxScale>(
        o.opt_choice("softmax_scale", {"plain", "yarn"}, static_cast<int>(a.softmax_scale)));
    if (a.softmax_scale == SoftmaxScale::yarn && a.rope_scaling != RopeScaling::yarn)
        o.fail("softmax_scale", "\"yarn\" needs a yarn rope_scaling");
    a.norm_eps = o.opt_double("norm_eps", 1e-6, positive);
    o.reject_unknown();
    return a;
}

IndexerConfig read_indexer(const JsonObject& o) {
    IndexerConfig x;
    x.n_head = o.get_int("n_head", 1);
    x.head_dim = o.get_int("head_dim", 1);
    x.top_k = o.get_int("top_k", 1);
    o.reject_unknown();
    return x;
}

MoeConfig read_moe(const JsonObject& o) {
    MoeConfig m;
    m.n_routed_experts = o.get_int("n_routed_experts", 1);
    m.top_k = o.get_int("top_k", 1);
    m.n_shared_experts = o.opt_int("n_shared_experts", 0, 0);
    m.moe_intermediate = o.get_int("intermediate", 1);
    m.shared_intermediate =
        o.opt_int("shared_intermediate", m.n_shared_experts * m.moe_intermediate, 0);
    m.latent_size = o.opt_int("latent_size", 0, 0);
    m.n_group = o.opt_int("n_group", 1, 1);
    m.topk_group = o.opt_int("topk_group", 1, 1);
    m.scoring = static_cast<Scoring>(o.opt_choice("scoring", {"sigmoid", "softmax"}, 0));
    m.renormalize = o.opt_bool("renormalize", true);
    m.routed_scaling_factor = o.opt_double("routed_scaling_factor", 1.0, positive);
    m.correction_bias = o.opt_bool("correction_bias", true);
    m.weights_from_biased_scores = o.opt_bool("weights_from_biased_scores", false);
    m.capacity_factor = o.opt_double("capacity_factor", 0.0, 0.0);
    m.drop_policy = static_cast<DropPolicy>(o.opt_choice("drop_policy", {"probs", "position"}, 0));
    m.expert_act = static_cast<ExpertAct>(o.opt_choice("expert_act", {"swiglu", "relu2"}, 0));
    o.reject_unknown();
    return m;
}

VisionConfig read_vision(const JsonObject& o) {
    VisionConfig v;
    v.present = true;
    v.patch_size = o.opt_int("patch_size", 14, 1);
    v.merge = o.opt_int("merge", 2, 1);
    v.width = o.get_int("width", 1);
    v.n_layer = o.get_int("n_layer", 1);
    v.n_head = o.get_int("n_head", 1);
    v.mlp = o.get_int("mlp", 1);
    v.pos_emb_size = o.opt_int("pos_emb_size", 64, 1);
    v.media_token_id = o.get_int64("media_token_id", 0, int_max);
    o.reject_unknown();
    return v;
}

}  // namespace

ModelConfig read_hymoe(const JsonObject& top) {
    ModelConfig c;
    c.model_type = top.get_string("model_type");
    c.vocab_size = top.get_int64("vocab_size", 1, int_max);
    c.hidden_size = top.get_int("hidden_size", 1);
    c.intermediate_size = top.opt_int("intermediate_size", 0, 0);
    c.rms_norm_eps = top.opt_double("rms_norm_eps", 1e-5, positive);
    c.max_position = top.get_int64("max_position_embeddings", 1, int_max);
    c.tie_word_embeddings = top.opt_bool("tie_word_embeddings", false);
    c.bos_id = top.opt_int64("bos_token_id", -1, -1, int_max);
    c.eos_id = top.opt_int64("eos_token_id", -1, -1, int_max);
    c.pad_id = top.opt_int64("pad_token_id", -1, -1, int_max);
    c.n_mtp_layers = top.opt_int("n_mtp_layers", 0, 0);
    apply_patterns(c,
                   top.get_string("layer_pattern"),
                   top.get_string("ffn_pattern"),
                   top.file(),
                   "layer_pattern",
                   "ffn_pattern");
    // A block's section is required when a layer uses it, and read (checked) whenever present.
    auto section = [&](const char* key, int users, const char* what) {
        if (top.has(key))
            return true;
        if (users > 0)
            top.fail(key,
                     cat("required key is missing (needed by ",
                         users,
                         " ",
                         what,
                         users == 1 ? " layer" : " layers",
                         " in the patterns)"));
        return false;
    };
    int n_mla = count_layers(c, Mixer::mla) + count_layers(c, Mixer::dsa);
    int n_moe = count_layers(c, Ffn::moe) + count_layers(c, Ffn::latent_moe);
    if (section("kda", count_layers(c, Mixer::kda), "KDA"))
        c.kda = read_kda(top.get_object("kda"));
    if (section("mla", n_mla, "MLA/DSA"))
        c.mla = read_mla(top.get_object("mla"));
    if (section("indexer", count_layers(c, Mixer::dsa), "DSA"))
        c.indexer = read_indexer(top.get_object("indexer"));
    if (section("moe", n_moe, "MoE"))
        c.moe = read_moe(top.get_object("moe"));
    if (top.has("vision"))
        c.vision = read_vision(top.get_object("vision"));
    top.reject_unknown();
    return c;
}

}  // namespace detail

// ---- load / parse ----------------------------------------------------------------------------

ModelConfig parse_model_config(const std::string& text, const std::string& where) {
    Json j = detail::parse_json_object(text, where);
    JsonObject top(j, where, "");
    std::string type = top.get_string("model_type");
    ModelConfig cfg;
    if (type == "kimi_linear") {
        cfg = detail::read_kimi_linear(top);
        detail::validate(cfg, where, detail::kimi_keys);
    } else if (type == "deepseek_v32") {
        cfg = detail::read_deepseek_v32(top);
        detail::validate(cfg, where, detail::deepseek_keys);
    } else if (type == "hymoe") {
        cfg = detail::read_hymoe(top);
        detail::validate(cfg, where, detail::native_keys);
    } else {
        top.fail(
            "model_type",
            cat("unknown model type \"", type, "\" (expected kimi_linear, deepseek_v32 or hymoe)"));
    }
    return cfg;
}

ModelConfig load_model_config(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in)
        HYMOE_FAIL(
            Exit::invalid, path, ": cannot open the model config (", std::strerror(errno), ")");
    std::ostringstream text;
    text << in.rdbuf();
    if (in.bad())
        HYMOE_FAIL(
            Exit::invalid, path, ": cannot read the model config (", std::strerror(errno), ")");
    return parse_model_config(text.str(), path);
}

// ---- native writer ---------------------------------------------------------------------------

std::string to_json(const ModelConfig& cfg) {
    using OJson = nlohmann::ordered_json;
    OJson j;
    j["model_type"] = "hymoe";
    j["vocab_size"] = cfg.vocab_size;
    j["hidden_size"] = cfg.hidden_size;
    j["intermediate_size"] = cfg.intermediate_size;
    j["rms_norm_eps"] = cfg.rms_norm_eps;
    j["max_position_embeddings"] = cfg.max_position;
    j["tie_word_embeddings"] = cfg.tie_word_embeddings;
    j["bos_token_id"] = cfg.bos_id;
    j["eos_token_id"] = cfg.eos_id;
    j["pad_token_id"] = cfg.pad_id;
    if (cfg.n_mtp_layers != 0)
        j["n_mtp_layers"] = cfg.n_mtp_layers;
    j["layer_pattern"] = layer_pattern(cfg);
    j["ffn_pattern"] = ffn_pattern(cfg);
    // A section is written when a layer uses it or when it holds non-default values.
    int n_mla = count_layers(cfg, Mixer::mla) + count_layers(cfg, Mixer::dsa);
    int n_moe = count_layers(cfg, Ffn::moe) + count_layers(cfg, Ffn::latent_moe);
    if (count_layers(cfg, Mixer::kda) > 0 || !(cfg.kda == KdaConfig{})) {
        const KdaConfig& k = cfg.kda;
        OJson o = {{"n_head", k.n_head}, {"head_dim", k.head_dim}, {"conv_kernel", k.conv_kernel}};
        o["gate_lower_bound"] = k.gate_lower_bound ? OJson(*k.gate_lower_bound) : OJson(nullptr);
        j["kda"] = o;
    }
    if (n_mla > 0 || !(cfg.mla == MlaConfig{})) {
        const MlaConfig& a = cfg.mla;
        OJson o = {{"n_head", a.n_head},
                   {"q_lora_rank", a.q_lora_rank},
                   {"kv_lora_rank", a.kv_lora_rank},
                   {"qk_nope_head_dim", a.qk_nope_head_dim},
                   {"qk_rope_head_dim", a.qk_rope_head_dim},
                   {"v_head_dim", a.v_head_dim},
                   {"nope", a.nope},
                   {"rope_theta", a.rope_theta}};
        if (a.rope_scaling == RopeScaling::yarn)
            o["rope_scaling"] = {{"type", "yarn"},
                                 {"factor", a.yarn_factor},
                                 {"original_max_position_embeddings", a.yarn_original_max_position},
                                 {"beta_fast", a.yarn_beta_fast},
                                 {"beta_slow", a.yarn_beta_slow},
                                 {"mscale", a.yarn_mscale},
                                 {"mscale_all_dim", a.yarn_mscale_all_dim}};
        else
            o["rope_scaling"] = nullptr;
        o["softmax_scale"] = a.softmax_scale == SoftmaxScale::yarn ? "yarn" : "plain";
        o["norm_eps"] = a.norm_eps;
        j["mla"] = o;
    }
    if (count_layers(cfg, Mixer::dsa) > 0 || !(cfg.indexer == IndexerConfig{}))
        j["indexer"] = {{"n_head", cfg.indexer.n_head},
                        {"head_dim", cfg.indexer.head_dim},
                        {"top_k", cfg.indexer.top_k}};
    if (n_moe > 0 || !(cfg.moe == MoeConfig{})) {
        const MoeConfig& m = cfg.moe;
        j["moe"] = {{"n_routed_experts", m.n_routed_experts},
                    {"top_k", m.top_k},
                    {"n_shared_experts", m.n_shared_experts},
                    {"intermediate", m.moe_intermediate},
                    {"shared_intermediate", m.shared_intermediate},
                    {"latent_size", m.latent_size},
                    {"n_group", m.n_group},
                    {"topk_group", m.topk_group},
                    {"scoring", to_string(m.scoring)},
                    {"renormalize", m.renormalize},
                    {"routed_scaling_factor", m.routed_scaling_factor},
                    {"correction_bias", m.correction_bias},
                    {"weights_from_biased_scores", m.weights_from_biased_scores},
                    {"capacity_factor", m.capacity_factor},
                    {"drop_policy", to_string(m.drop_policy)},
                    {"expert_act", to_string(m.expert_act)}};
    }
    if (cfg.vision.present) {
        const VisionConfig& v = cfg.vision;
        j["vision"] = {{"patch_size", v.patch_size},
                       {"merge", v.merge},
                       {"width", v.width},
                       {"n_layer", v.n_layer},
                       {"n_head", v.n_head},
                       {"mlp", v.mlp},
                       {"pos_emb_size", v.pos_emb_size},
                       {"media_token_id", v.media_token_id}};
    }
    return j.dump(2) + "\n";
}

// ---- log summary -----------------------------------------------------------------------------

namespace {

std::string human(int64_t n) {
    std::ostringstream s;
    s << std::fixed;
    double x = static_cast<double>(n);
    if (x >= 1e12)
        s << std::setprecision(3) << x / 1e12 << "T";
    else if (x >= 1e9)
        s << std::setprecision(2) << x / 1e9 << "B";
    else if (x >= 1e6)
        s << std::setprecision(2) << x / 1e6 << "M";
    else if (x >= 1e3)
        s << std::setprecision(2) << x / 1e3 << "K";
    else
        s << n;
    return s.str();
}

// "KKKG KKKG KKKG | KKKG" → "KKKG x3 | KKKG": runs of equal space-separated groups collapsed.
std::string collapse(const std::string& pattern) {
    std::istringstream in(pattern);
    std::vector<std::string> groups;
    for (std::string g; in >> g;)
        groups.push_back(g);
    std::string out;
    for (size_t i = 0; i < groups.size();) {
        size_t j = i;
        while (j < groups.size() && groups[j] == groups[i])
            ++j;
        out += (out.empty() ? "" : " ") + groups[i];
        if (j - i > 1 && groups[i] != "|")
            out += cat(" x", j - i);
        i = groups[i] == "|" ? i + 1 : j;
    }
    return out;
}

}  // namespace

std::string describe(const ModelConfig& cfg) {
    std::ostringstream s;
    const int n = static_cast<int>(cfg.layers.size());
    int gated = 0;
    for (const LayerSpec& l : cfg.layers)
        gated += l.gated;
    s << "model " << cfg.model_type << ": " << n << " layers [" << collapse(layer_pattern(cfg))
      << "] [" << collapse(ffn_pattern(cfg)) << "]";
    if (!cfg.stage_boundaries.empty())
        s << " in " << cfg.stage_boundaries.size() + 1 << " stages";
    s << " (mixers: " << count_layers(cfg, Mixer::kda) << " kda, " << count_layers(cfg, Mixer::mla)
      << " mla, " << count_layers(cfg, Mixer::dsa) << " dsa, " << gated
      << " gated; ffn: " << count_layers(cfg, Ffn::dense) << " dense, "
      << count_layers(cfg, Ffn::moe) << " moe, " << count_layers(cfg, Ffn::latent_moe)
      << " latent moe); hidden " << cfg.hidden_size << ", vocab " << cfg.vocab_size << ", context "
      << cfg.max_position;
    if (count_layers(cfg, Ffn::dense) > 0)
        s << ", dense ffn " << cfg.intermediate_size;
    if (count_layers(cfg, Mixer::kda) > 0)
        s << "; KDA " << cfg.kda.n_head << " heads x " << cfg.kda.head_dim << ", conv "
          << cfg.kda.conv_kernel;
    if (count_layers(cfg, Mixer::kda) < n) {
        const MlaConfig& a = cfg.mla;
        s << "; MLA " << a.n_head << " heads, q/kv latent " << a.q_lora_rank << "/"
          << a.kv_lora_rank << ", qk " << a.qk_nope_head_dim << "+" << a.qk_rope_head_dim << ", v "
          << a.v_head_dim << (a.nope ? ", NoPE" : "")
          << (a.rope_scaling == RopeScaling::yarn ? ", yarn x" : "");
        if (a.rope_scaling == RopeScaling::yarn)
            s << a.yarn_factor;
    }
    if (count_layers(cfg, Mixer::dsa) > 0)
        s << "; indexer " << cfg.indexer.n_head << " heads x " << cfg.indexer.head_dim << ", top-"
          << cfg.indexer.top_k;
    if (count_layers(cfg, Ffn::dense) < n) {
        const MoeConfig& m = cfg.moe;
        s << "; MoE " << m.n_routed_experts << " experts, top-" << m.top_k << " + "
          << m.n_shared_experts << " shared, width " << m.moe_intermediate << " ("
          << to_string(m.expert_act) << ")";
        if (count_layers(cfg, Ffn::latent_moe) > 0)
            s << ", latent " << m.latent_size;
        s << ", " << m.topk_group << " of " << m.n_group << " groups, " << to_string(m.scoring)
          << ", scale " << m.routed_scaling_factor
          << (m.capacity_factor > 0.0 ? ", capacity " : ", dropless");
        if (m.capacity_factor > 0.0)
            s << m.capacity_factor;
    }
    ParamCount pc = count_params(cfg);
    if (cfg.vision.present)
        s << "; vision " << cfg.vision.n_layer << " layers x " << cfg.vision.width << " ("
          << human(pc.vision) << ")";
    s << "; params " << human(pc.total) << " total, " << human(pc.active) << " active per token.";
    return s.str();
}

}  // namespace hymoe::model
