// Built-in model presets. tiny is spec/model-math.md §13 exactly (tests, quickstart); tiny-kimi and
// tiny-deepseek are the two HF families' structures at tiny size; mid is a benchmark size; and
// flagship-2.8t is the target architecture (DESIGN.md "Models") sized for `plan` jobs.
// inputs/models/tiny/config.json is the tiny preset in the native format (a unit test keeps the
// two equal). Parameter counts below are count_params() (embedding + head counted, no MTP).
#include <string>
#include <vector>

#include "config_read.h"
#include "hymoe/core/error.h"

namespace hymoe::model {

namespace {

using detail::apply_patterns;

// The token ids every tiny preset shares (byte-sized vocabulary of 256).
void tiny_common(ModelConfig& c) {
    c.vocab_size = 256;
    c.hidden_size = 64;
    c.intermediate_size = 128;
    c.rms_norm_eps = 1e-5;
    c.max_position = 4096;
    c.pad_id = 0;
    c.bos_id = 1;
    c.eos_id = 2;
}

void tiny_kda(ModelConfig& c) {
    c.kda.n_head = 4;
    c.kda.head_dim = 16;
    c.kda.conv_kernel = 4;
}

void tiny_mla(ModelConfig& c, int q_lora_rank) {
    c.mla.n_head = 4;
    c.mla.q_lora_rank = q_lora_rank;
    c.mla.kv_lora_rank = 32;
    c.mla.qk_nope_head_dim = 16;
    c.mla.qk_rope_head_dim = 8;
    c.mla.v_head_dim = 16;
}

void tiny_moe(ModelConfig& c, int n_group, double scale) {
    c.moe.n_routed_experts = 8;
    c.moe.top_k = 2;
    c.moe.n_shared_experts = 1;
    c.moe.moe_intermediate = 32;
    c.moe.shared_intermediate = 32;
    c.moe.n_group = n_group;
    c.moe.topk_group = 1;
    c.moe.routed_scaling_factor = scale;
}

// §13: [KDA+dense, KDA+MoE, KDA+MoE, GatedDSA+MoE]; indexer 16 heads (>= 16 to avoid top-k ties)
// x 16, top-8; MoE 8 experts top-2 + 1 shared, groups 2/1, rho 2.5; latent 32 (for latent-MoE
// tests that flip the FFN letters); vision 16x16 px, p=4, 2x2 merge, C=32, 2 layers, 2 heads,
// mlp 64. 366,036 parameters (vision 45,600), 209,844 active.
ModelConfig tiny() {
    ModelConfig c;
    c.model_type = "hymoe";
    tiny_common(c);
    apply_patterns(c, "KKKG", "-EEE", "preset tiny", "layer_pattern", "ffn_pattern");
    tiny_kda(c);
    tiny_mla(c, 32);
    c.indexer = {16, 16, 8};
    tiny_moe(c, 2, 2.5);
    c.moe.latent_size = 32;
    c.vision.present = true;
    c.vision.patch_size = 4;
    c.vision.merge = 2;
    c.vision.width = 32;
    c.vision.n_layer = 2;
    c.vision.n_head = 2;
    c.vision.mlp = 64;
    c.vision.pos_emb_size = 8;
    c.vision.media_token_id = 3;
    return c;
}

// Kimi-Linear's structure: 3 KDA : 1 NoPE MLA without query latent, first layer dense, sigmoid
// router with bias, one group, rho 2.446.
ModelConfig tiny_kimi() {
    ModelConfig c;
    c.model_type = "kimi_linear";
    tiny_common(c);
    apply_patterns(c, "KKKM", "-EEE", "preset tiny-kimi", "layer_pattern", "ffn_pattern");
    tiny_kda(c);
    tiny_mla(c, 0);
    c.mla.nope = true;
    tiny_moe(c, 1, 2.446);
    return c;
}

// DeepSeek-V3.2's structure: every layer DSA, first layer dense, yarn RoPE (factor 4 over 64
// positions, with the mscale² softmax correction), groups 2/1, rho 2.5, eps 1e-6.
ModelConfig tiny_deepseek() {
    ModelConfig c;
    c.model_type = "deepseek_v32";
    tiny_common(c);
    c.rms_norm_eps = 1e-6;
    c.max_position = 256;
    apply_patterns(c, "DDDD", "-EEE", "preset tiny-deepseek", "layer_pattern", "ffn_pattern");
    tiny_mla(c, 32);
    c.mla.rope_scaling = RopeScaling::yarn;
    c.mla.yarn_factor = 4.0;
    c.mla.yarn_original_max_position = 64;
    c.mla.yarn_mscale = 1.0;
    c.mla.yarn_mscale_all_dim = 1.0;
    c.mla.softmax_scale = SoftmaxScale::yarn;
    c.indexer = {16, 16, 8};
    tiny_moe(c, 2, 2.5);
    return c;
}

// Benchmarks: d=1024, 8 layers (3 KDA : 1 gated DSA), 64 experts top-8 + 1 shared of width 512.
// 829,802,224 parameters, 213,239,536 active.
ModelConfig mid() {
    ModelConfig c;
    c.model_type = "hymoe";
    c.vocab_size = 32768;
    c.hidden_size = 1024;
    c.intermediate_size = 4096;
    c.rms_norm_eps = 1e-5;
    c.max_position = 32768;
    c.pad_id = 0;
    c.bos_id = 1;
    c.eos_id = 2;
    apply_patterns(c, "KKKG KKKG", "-EEE EEEE", "preset mid", "layer_pattern", "ffn_pattern");
    c.kda.n_head = 8;
    c.kda.head_dim = 128;
    c.mla.n_head = 8;
    c.mla.q_lora_rank = 384;
    c.mla.kv_lora_rank = 256;
    c.mla.qk_nope_head_dim = 64;
    c.mla.qk_rope_head_dim = 32;
    c.mla.v_head_dim = 64;
    c.indexer = {16, 64, 256};
    c.moe.n_routed_experts = 64;
    c.moe.top_k = 8;
    c.moe.n_shared_experts = 1;
    c.moe.moe_intermediate = 512;
    c.moe.shared_intermediate = 512;
    c.moe.routed_scaling_factor = 2.5;
    return c;
}

// The target: KDA + gated DSA (3:1) + LatentMoE + vision, 1M context.
//   d = 7168, vocab 163840 (Kimi tokenizer ids), 96 layers = 24 x "KKKG": 72 KDA (64 heads x 128,
//   safe gate lb -5) + 24 gated DSA (MLA 64 heads, r_q 1536, r_kv 512, qk 128+64, v 128, NoPE as
//   Kimi-Linear; indexer 64 x 128, top-2048); layer 0 dense SwiGLU 18432, layers 1-95 LatentMoE:
//   896 routed experts, top-16, in a latent of 3584 = d/2, relu2 experts of width 4608
//   (2·3584·4608 = 33.0M each, 29.6B per layer), 2 shared experts (total width 4096) at full width,
//   8 groups / 4 kept; MoonViT-size vision (1152 wide, 27 layers).
//   count_params: 2,847,219,879,024 total (2.85T: routed experts 2.81T, attention 21.4B,
//   vision 0.47B); 85,428,696,704 active per token (85.4B: 16 routed + 2 shared experts with
//   routers and latent projections 61.3B, attention 21.4B, embedding + head 2.35B, dense 0.4B).
ModelConfig flagship() {
    ModelConfig c;
    c.model_type = "hymoe";
    c.vocab_size = 163840;
    c.hidden_size = 7168;
    c.intermediate_size = 18432;
    c.rms_norm_eps = 1e-5;
    c.max_position = 1048576;
    c.bos_id = 163584;
    c.eos_id = 163586;
    c.pad_id = 163839;
    std::string layers, ffn = "-";
    for (int i = 0; i < 24; ++i)
        layers += "KKKG ";
    for (int i = 1; i < 96; ++i)
        ffn += 'L';
    apply_patterns(c, layers, ffn, "preset flagship-2.8t", "layer_pattern", "ffn_pattern");
    c.kda.n_head = 64;
    c.kda.head_dim = 128;
    c.kda.gate_lower_bound = -5.0;
    c.mla.n_head = 64;
    c.mla.q_lora_rank = 1536;
    c.mla.kv_lora_rank = 512;
    c.mla.qk_nope_head_dim = 128;
    c.mla.qk_rope_head_dim = 64;
    c.mla.v_head_dim = 128;
    c.mla.nope = true;
    c.indexer = {64, 128, 2048};
    c.moe.n_routed_experts = 896;
    c.moe.top_k = 16;
    c.moe.n_shared_experts = 2;
    c.moe.moe_intermediate = 4608;
    c.moe.shared_intermediate = 4096;
    c.moe.latent_size = 3584;
    c.moe.n_group = 8;
    c.moe.topk_group = 4;
    c.moe.routed_scaling_factor = 2.5;
    c.moe.expert_act = ExpertAct::relu2;
    c.vision.present = true;
    c.vision.patch_size = 14;
    c.vision.merge = 2;
    c.vision.width = 1152;
    c.vision.n_layer = 27;
    c.vision.n_head = 16;
    c.vision.mlp = 4304;
    c.vision.pos_emb_size = 64;
    c.vision.media_token_id = 163605;
    return c;
}

struct Preset {
    const char* name;
    ModelConfig (*make)();
};

const Preset presets[] = {
    {"tiny", tiny},
    {"tiny-kimi", tiny_kimi},
    {"tiny-deepseek", tiny_deepseek},
    {"mid", mid},
    {"flagship-2.8t", flagship},
};

}  // namespace

std::vector<std::string> preset_names() {
    std::vector<std::string> names;
    for (const Preset& p : presets)
        names.emplace_back(p.name);
    return names;
}

ModelConfig preset_config(const std::string& name) {
    for (const Preset& p : presets) {
        if (name != p.name)
            continue;
        ModelConfig c = p.make();
        detail::validate(c, cat("preset ", name), detail::native_keys);
        return c;
    }
    std::string names;
    for (const Preset& p : presets)
        names += cat(names.empty() ? "" : ", ", p.name);
    HYMOE_FAIL(Exit::invalid, "model.preset: unknown preset \"", name, "\" (known: ", names, ")");
}

}  // namespace hymoe::model
