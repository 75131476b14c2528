// Private to src/model/config*.cpp. JsonObject: a checked reader over one JSON object of a model
// config file, so that every error is one sentence naming the file and the full key path
// ("x/config.json: moe.top_k: expected an integer, got string"). KeyNames + validate: the checks
// that span several keys, shared by every source, each naming the key as that source spells it.
#pragma once

#include <cstdint>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "hymoe/model/config.h"

namespace hymoe::model::detail {

using Json = nlohmann::json;

constexpr int64_t int_max = std::numeric_limits<int>::max();
constexpr double inf = std::numeric_limits<double>::infinity();
constexpr double positive = std::numeric_limits<double>::denorm_min();  // lower bound: "> 0"

class JsonObject {
public:
    // j must be a JSON object; file names the source; prefix is the key path of j ("" at the top).
    JsonObject(const Json& j, std::string file, std::string prefix);

    const std::string& file() const { return file_; }
    std::string path(const std::string& key) const;  // "moe" + "top_k" → "moe.top_k"
    bool has(const std::string& key) const;          // present and not null (marks it seen)
    [[noreturn]] void fail(const std::string& key, const std::string& what) const;

    // Required values (missing or null is an error), range-checked to [lo, hi].
    int get_int(const std::string& key, int64_t lo, int64_t hi = int_max) const;
    int64_t get_int64(const std::string& key, int64_t lo, int64_t hi) const;
    double get_double(const std::string& key, double lo, double hi = inf) const;
    bool get_bool(const std::string& key) const;
    std::string get_string(const std::string& key) const;
    std::vector<int64_t> get_int_list(const std::string& key, int64_t lo, int64_t hi) const;
    JsonObject get_object(const std::string& key) const;
    // Optional values: fallback when missing or null.
    int opt_int(const std::string& key, int fallback, int64_t lo, int64_t hi = int_max) const;
    int64_t opt_int64(const std::string& key, int64_t fallback, int64_t lo, int64_t hi) const;
    double opt_double(const std::string& key, double fallback, double lo, double hi = inf) const;
    bool opt_bool(const std::string& key, bool fallback) const;
    std::string opt_string(const std::string& key, const std::string& fallback) const;
    // One of `names` (the string form of an enum); returns its index.
    int get_choice(const std::string& key, const std::vector<std::string>& names) const;
    int opt_choice(const std::string& key,
                   const std::vector<std::string>& names,
                   int fallback) const;

    // Strict (native) objects: every key must have been read; otherwise an "unknown key" error.
    void reject_unknown() const;

private:
    const Json& require(const std::string& key) const;
    int64_t to_int64(const std::string& key, const Json& v, int64_t lo, int64_t hi) const;

    const Json& j_;
    std::string file_;
    std::string prefix_;
    mutable std::set<std::string> seen_;  // keys read so far (for reject_unknown)
};

// Parses text into a JSON object; errors name `where`.
Json parse_json_object(const std::string& text, const std::string& where);

// The key names a source uses for the values that validate() checks.
struct KeyNames {
    const char* layers;             // the key that fixes the layer stack
    const char* intermediate_size;  // dense FFN width
    const char* kda_n_head;
    const char* kda_head_dim;
    const char* kda_conv_kernel;
    const char* mla_n_head;
    const char* mla_q_lora_rank;
    const char* mla_kv_lora_rank;
    const char* mla_qk_nope_head_dim;
    const char* mla_qk_rope_head_dim;
    const char* mla_v_head_dim;
    const char* indexer_n_head;
    const char* indexer_head_dim;
    const char* indexer_top_k;
    const char* moe_n_routed_experts;
    const char* moe_top_k;
    const char* moe_intermediate;
    const char* moe_shared_intermediate;
    const char* moe_latent_size;
    const char* moe_n_group;
    const char* moe_topk_group;
    const char* moe_weights_from_biased_scores;
    const char* bos_id;
    const char* eos_id;
    const char* pad_id;
};
extern const KeyNames native_keys;
extern const KeyNames kimi_keys;
extern const KeyNames deepseek_keys;

// Cross-key checks (sizes of every block in use, experts vs top_k and groups, DSA needs r_q, token
// ids within the vocabulary, stage boundaries, vision head size). `where` names the file or preset.
void validate(const ModelConfig& cfg, const std::string& where, const KeyNames& keys);

// rope_scaling as HF writes it (null, or {type|rope_type: yarn, factor, ...}) into cfg.mla, and the
// HF softmax-scale rule (yarn when mscale_all_dim > 0). strict: other keys are errors (native).
void read_rope_scaling(const JsonObject& obj, const std::string& key, MlaConfig& mla, bool strict);

// Resolves native patterns ("KKKG | KKKG", "-EEE | EEEE") into cfg.layers and
// cfg.stage_boundaries; errors name `where` and the key.
void apply_patterns(ModelConfig& cfg,
                    const std::string& layers,
                    const std::string& ffns,
                    const std::string& where,
                    const std::string& layer_key,
                    const std::string& ffn_key);

// The readers of the three file types (config_hf.cpp: kimi_linear, deepseek_v32; config.cpp:
// hymoe).
ModelConfig read_kimi_linear(const JsonObject& top);
ModelConfig read_deepseek_v32(const JsonObject& top);
ModelConfig read_hymoe(const JsonObject& top);

}  // namespace hymoe::model::detail
