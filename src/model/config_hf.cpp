// Readers of HF config.json files: model_type kimi_linear (Kimi-Linear-48B-A3B, modeling_kimi.py)
// and deepseek_v32 (DeepSeek-V3.2). Keys and their meaning: spec/model-math.md §2. Keys that do
// not change the math (architectures, torch_dtype, ...) are ignored; quantization_config is read
// for FP8 block-scaled checkpoints (DeepSeek-V3's "fp8" e4m3 format, nothing else); keys
// that would change it in a way hymoe does not implement (hidden_act other than silu, attention
// bias, RoPE scaling other than yarn) are errors.
#include <string>
#include <vector>

#include "config_read.h"
#include "hymoe/core/error.h"

namespace hymoe::model::detail {

namespace {

// quantization_config as DeepSeek-V3/V3.2 publish it (HF's FineGrainedFP8Config): quant_method
// "fp8", fmt "e4m3" (default), weight_block_size [rows, cols] (default [128, 128]),
// activation_scheme "dynamic" (the default; activations stay unquantized here either way).
WeightQuant read_quantization(const JsonObject& top) {
    WeightQuant w;
    if (!top.has("quantization_config"))
        return w;
    JsonObject q = top.get_object("quantization_config");
    const std::string method = q.get_string("quant_method");
    if (method != "fp8")
        q.fail(
            "quant_method",
            cat("hymoe reads FP8 block-scaled checkpoints (\"fp8\") only, got \"", method, "\""));
    const std::string fmt = q.opt_string("fmt", "e4m3");
    if (fmt != "e4m3")
        q.fail("fmt", cat("hymoe reads e4m3 FP8 weights only, got \"", fmt, "\""));
    q.opt_choice("activation_scheme", {"dynamic"}, 0);
    w.fp8 = true;
    if (q.has("weight_block_size")) {
        const std::vector<int64_t> b = q.get_int_list("weight_block_size", 1, int_max);
        if (b.size() != 2)
            q.fail("weight_block_size",
                   cat("expected two block sides [rows, cols], got ", b.size(), " numbers"));
        w.block_rows = static_cast<int>(b[0]);
        w.block_cols = static_cast<int>(b[1]);
    }
    return w;
}

// n_shared_experts × moe_intermediate_size, the shared experts' width, fits an int (a fuzz
// finding: 555555551 × 32 overflowed).
int shared_width(const JsonObject& top, const MoeConfig& m) {
    const int64_t w = int64_t{m.n_shared_experts} * m.moe_intermediate;
    if (w > int_max)
        top.fail("n_shared_experts",
                 cat("n_shared_experts × moe_intermediate_size is ", w, ", above ", int_max));
    return static_cast<int>(w);
}

// Fields both families spell the same way.
void read_common(const JsonObject& top, ModelConfig& c) {
    c.quant = read_quantization(top);
    c.vocab_size = top.get_int64("vocab_size", 1, int_max);
    c.hidden_size = top.get_int("hidden_size", 1);
    c.rms_norm_eps = top.opt_double("rms_norm_eps", 1e-6, positive);
    c.tie_word_embeddings = top.opt_bool("tie_word_embeddings", false);
    c.bos_id = top.opt_int64("bos_token_id", -1, -1, int_max);
    c.eos_id = top.opt_int64("eos_token_id", -1, -1, int_max);
    c.pad_id = top.opt_int64("pad_token_id", -1, -1, int_max);
    c.n_mtp_layers = top.opt_int("num_nextn_predict_layers", 0, 0);
    std::string act = top.opt_string("hidden_act", "silu");
    if (act != "silu")
        top.fail("hidden_act", cat("hymoe implements SwiGLU (silu), got \"", act, "\""));
}

// MoE layers as both modeling files place them: layer i is MoE iff experts are configured,
// i >= first_k_dense_replace and i % moe_layer_freq == 0.
void place_ffn(const JsonObject& top, ModelConfig& c, bool has_experts) {
    int first_dense = top.opt_int("first_k_dense_replace", 0, 0);
    int freq = top.opt_int("moe_layer_freq", 1, 1);
    for (int i = 0; i < static_cast<int>(c.layers.size()); ++i)
        c.layers[i].ffn = has_experts && i >= first_dense && i % freq == 0 ? Ffn::moe : Ffn::dense;
    if (count_layers(c, Ffn::dense) > 0)
        c.intermediate_size = top.get_int("intermediate_size", 1);
}

// MLA fields (q_lora_rank null = no query latent); required when any layer is MLA/DSA.
void read_mla_fields(const JsonObject& top, ModelConfig& c) {
    bool need = count_layers(c, Mixer::kda) < static_cast<int>(c.layers.size());
    auto dim = [&](const char* key, int lo) {
        return need ? top.get_int(key, lo) : top.opt_int(key, 0, lo);
    };
    MlaConfig& a = c.mla;
    a.n_head = dim("num_attention_heads", 1);
    a.q_lora_rank = top.opt_int("q_lora_rank", 0, 0);
    a.kv_lora_rank = dim("kv_lora_rank", 1);
    a.qk_nope_head_dim = dim("qk_nope_head_dim", 0);
    a.qk_rope_head_dim = dim("qk_rope_head_dim", 0);
    a.v_head_dim = dim("v_head_dim", 1);
    a.rope_theta = top.opt_double("rope_theta", 10000.0, positive);
    read_rope_scaling(top, "rope_scaling", a, false);
    a.norm_eps = 1e-6;  // q_a_layernorm / kv_a_layernorm use the RMSNorm default in both files
}

}  // namespace

ModelConfig read_kimi_linear(const JsonObject& top) {
    ModelConfig c;
    c.model_type = "kimi_linear";
    read_common(top, c);
    if (!top.has("model_max_length") && !top.has("max_position_embeddings"))
        top.fail("model_max_length", "required key is missing (or max_position_embeddings)");
    c.max_position = top.has("model_max_length")
                         ? top.get_int64("model_max_length", 1, int_max)
                         : top.get_int64("max_position_embeddings", 1, int_max);
    const int n = top.get_int("num_hidden_layers", 1);
    c.layers.assign(n, LayerSpec{Mixer::mla, false, Ffn::dense});

    // KDA layers: linear_attn_config lists both kinds 1-BASED (is_kda_layer(i) = (i+1) ∈
    // kda_layers); without linear_attn_config every layer is full attention.
    if (top.has("linear_attn_config")) {
        JsonObject lin = top.get_object("linear_attn_config");
        std::vector<int64_t> kda = lin.get_int_list("kda_layers", 1, n);
        std::vector<int64_t> full = lin.get_int_list("full_attn_layers", 1, n);
        std::vector<int> kind(n, 0);  // 0 unlisted, 1 kda, 2 full attention
        for (int64_t l : kda) {
            if (kind[l - 1] == 1)
                lin.fail("kda_layers", cat("layer ", l, " is listed twice"));
            kind[l - 1] = 1;
        }
        for (int64_t l : full) {
            if (kind[l - 1] == 1)
                lin.fail("kda_layers",
                         cat("layer ", l, " is listed in both kda_layers and full_attn_layers"));
            if (kind[l - 1] == 2)
                lin.fail("full_attn_layers", cat("layer ", l, " is listed twice"));
            kind[l - 1] = 2;
        }
        for (int i = 0; i < n; ++i)
            if (kind[i] == 0)
                lin.fail("kda_layers",
                         cat("layer ",
                             i + 1,
                             " (1-based, of ",
                             n,
                             ") is in neither kda_layers nor full_attn_layers"));
        for (int i = 0; i < n; ++i)
            if (kind[i] == 1)
                c.layers[i].mixer = Mixer::kda;
        if (count_layers(c, Mixer::kda) > 0) {
            c.kda.n_head = lin.get_int("num_heads", 1);
            c.kda.head_dim = lin.get_int("head_dim", 1);
            c.kda.conv_kernel = lin.opt_int("short_conv_kernel_size", 4, 1);
            if (lin.has("gate_lower_bound")) {
                double lb = lin.get_double("gate_lower_bound", -inf, 0.0);
                if (lb == 0.0)
                    lin.fail("gate_lower_bound", "must be negative (or null), got 0");
                c.kda.gate_lower_bound = lb;
            }
        }
    }
    read_mla_fields(top, c);
    c.mla.nope = top.opt_bool("mla_use_nope", false);

    // KimiMoEGate: sigmoid (or softmax) scores + e_score_correction_bias, grouped top-k when
    // use_grouped_topk, renormalised, × routed_scaling_factor.
    bool has_experts = top.has("num_experts");
    place_ffn(top, c, has_experts);
    if (has_experts) {
        MoeConfig& m = c.moe;
        m.n_routed_experts = top.get_int("num_experts", 1);
        m.top_k = top.get_int("num_experts_per_token", 1);
        m.n_shared_experts = top.opt_int("num_shared_experts", 0, 0);
        m.moe_intermediate = top.get_int("moe_intermediate_size", 1);
        m.shared_intermediate = shared_width(top, m);
        m.scoring = static_cast<Scoring>(
            top.opt_choice("moe_router_activation_func", {"sigmoid", "softmax"}, 0));
        m.renormalize = top.opt_bool("moe_renormalize", true);
        m.routed_scaling_factor = top.opt_double("routed_scaling_factor", 1.0, positive);
        bool grouped = top.opt_bool("use_grouped_topk", false);
        m.n_group = grouped ? top.opt_int("num_expert_group", 1, 1) : 1;
        m.topk_group = grouped ? top.opt_int("topk_group", 1, 1) : 1;
        m.correction_bias = true;              // the HF gate always holds the bias
        m.weights_from_biased_scores = false;  // DeepSeek/vLLM semantics (model-math §6)
    }
    return c;
}

ModelConfig read_deepseek_v32(const JsonObject& top) {
    ModelConfig c;
    c.model_type = "deepseek_v32";
    read_common(top, c);
    c.max_position = top.get_int64("max_position_embeddings", 1, int_max);
    if (top.opt_bool("attention_bias", false))
        top.fail("attention_bias", "hymoe's MLA has no projection biases, got true");
    const int n = top.get_int("num_hidden_layers", 1);
    c.layers.assign(n, LayerSpec{Mixer::dsa, false, Ffn::dense});  // every layer is DSA
    read_mla_fields(top, c);
    c.indexer.n_head = top.get_int("index_n_heads", 1);
    c.indexer.head_dim = top.get_int("index_head_dim", 1);
    c.indexer.top_k = top.get_int("index_topk", 1);

    // Gate (noaux_tc): sigmoid scores, + e_score_correction_bias for selection, group-limited
    // top-k, weights renormalised (norm_topk_prob), × routed_scaling_factor.
    bool has_experts = top.has("n_routed_experts");
    place_ffn(top, c, has_experts);
    if (has_experts) {
        MoeConfig& m = c.moe;
        m.n_routed_experts = top.get_int("n_routed_experts", 1);
        m.top_k = top.get_int("num_experts_per_tok", 1);
        m.n_shared_experts = top.opt_int("n_shared_experts", 0, 0);
        m.moe_intermediate = top.get_int("moe_intermediate_size", 1);
        m.shared_intermediate = shared_width(top, m);
        m.scoring = static_cast<Scoring>(top.opt_choice("scoring_func", {"sigmoid", "softmax"}, 0));
        m.renormalize = top.opt_bool("norm_topk_prob", true);
        m.routed_scaling_factor = top.opt_double("routed_scaling_factor", 1.0, positive);
        // noaux_tc: bias + groups; group_limited_greedy: groups, no bias; greedy: neither.
        int method =
            top.opt_choice("topk_method", {"noaux_tc", "group_limited_greedy", "greedy"}, 0);
        m.correction_bias = method == 0;
        m.n_group = method == 2 ? 1 : top.opt_int("n_group", 1, 1);
        m.topk_group = method == 2 ? 1 : top.opt_int("topk_group", 1, 1);
    }
    return c;
}

}  // namespace hymoe::model::detail
