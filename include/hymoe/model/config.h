// Model configuration: one ModelConfig for every source (an HF config.json of model_type
// kimi_linear or deepseek_v32, the native hymoe config.json, a built-in preset). Each layer's mixer
// and FFN are resolved once here into `layers` (DESIGN.md "Models"); the blocks dispatch on that
// annotation and never re-derive it. No tensors, no weights. Math and weight shapes:
// spec/model-math.md §2-8; the native keys: docs/model-config.md.
// Invariant: every ModelConfig this header returns has passed validation (sizes positive for every
// block in use, top_k within the experts, patterns consistent); every failure is a
// hymoe::Error(Exit::invalid) whose one sentence names the file (or preset) and the key.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace hymoe::model {

// ---- per-layer annotation --------------------------------------------------------------------

enum class Mixer {
    kda,  // Kimi Delta Attention (linear attention, fp32 state [H, K, V]); model-math §3
    mla,  // full multi-head latent attention; model-math §4
    dsa,  // MLA restricted to the lightning indexer's top-k keys; model-math §5
};

enum class Ffn {
    dense,       // SwiGLU MLP of width ModelConfig::intermediate_size
    moe,         // routed top-k + shared experts at full width; model-math §6
    latent_moe,  // experts in a down-projected latent of width MoeConfig::latent_size; §7
};

struct LayerSpec {
    Mixer mixer = Mixer::kda;
    bool gated = false;  // sigmoid output gate on the attention output (mla/dsa only, model-math
                         // §5: o ⊙ σ(W_g x) before o_proj); always false for kda, whose low-rank
                         // output gate is part of the block
    Ffn ffn = Ffn::dense;
    bool operator==(const LayerSpec&) const = default;
};

// ---- per-block settings ----------------------------------------------------------------------

struct KdaConfig {
    int n_head = 0;       // H: heads; key dim K = value dim V = head_dim, D = H·K
    int head_dim = 0;     // K = V (also the rank of the low-rank decay and output gates)
    int conv_kernel = 4;  // W: depthwise causal short-conv width on q, k, v
    std::optional<double> gate_lower_bound;  // fla "safe gate" g = lb·σ(e^{A_log}(f+dt_bias)) with
                                             // lb < 0 (Kimi-K3: −5); empty = −e^{A_log}·softplus
    bool operator==(const KdaConfig&) const = default;
};

enum class RopeScaling { none, yarn };
enum class SoftmaxScale {
    plain,  // τ = (d_n + d_r)^{-1/2}
    yarn,   // τ = (d_n + d_r)^{-1/2} · m², m = 0.1·yarn_mscale_all_dim·ln(yarn_factor) + 1
};

struct MlaConfig {
    int n_head = 0;            // H: attention heads
    int q_lora_rank = 0;       // r_q: query latent (wq_a [r_q, d], wq_b [H(d_n+d_r), r_q]);
                               // 0 = none (q_proj [H(d_n+d_r), d], Kimi-Linear)
    int kv_lora_rank = 0;      // r_kv: compressed KV latent, cached per token with the rope key
    int qk_nope_head_dim = 0;  // d_n: per-head query/key dims without RoPE
    int qk_rope_head_dim = 0;  // d_r: per-head query dims with RoPE (key part shared by all heads)
    int v_head_dim = 0;        // d_v: per-head value dim
    bool nope = false;         // no RoPE on q_r/k_r (Kimi-Linear); the DSA indexer keeps its RoPE
    double rope_theta = 10000.0;                   // RoPE base (MLA and the DSA indexer)
    RopeScaling rope_scaling = RopeScaling::none;  // yarn: the yarn_* fields below apply
    double yarn_factor = 1.0;                      // context extension factor (DeepSeek-V3.2: 40)
    int64_t yarn_original_max_position = 0;        // pre-extension context (DeepSeek-V3.2: 4096)
    double yarn_beta_fast = 32.0;                  // correction range, fast end (rotations)
    double yarn_beta_slow = 1.0;                   // correction range, slow end
    double yarn_mscale = 1.0;          // HF rope_scaling.mscale: cos/sin × mscale-term ratio
    double yarn_mscale_all_dim = 0.0;  // HF rope_scaling.mscale_all_dim: the ratio's denominator
                                       // (1 when equal to mscale) and SoftmaxScale::yarn's m
    SoftmaxScale softmax_scale = SoftmaxScale::plain;  // τ rule, see mla_softmax_scale()
    double norm_eps = 1e-6;                            // ε of the latent RMSNorms q_norm / kv_norm
    bool operator==(const MlaConfig&) const = default;
};

// DSA lightning indexer (model-math §5). It reads MLA's query latent c_q, so DSA needs r_q > 0.
struct IndexerConfig {
    int n_head = 0;       // H_I: indexer heads
    int head_dim = 0;     // d_I: indexer head dim, [rope d_r | nope d_I − d_r]
    int top_k = 0;        // keys kept per query (DeepSeek-V3.2: 2048)
    int scale_heads = 0;  // the H_I of the score scale H_I^{-1/2} when n_head is one tp rank's
                          // share (model/shard.h local configs); 0: n_head
    bool operator==(const IndexerConfig&) const = default;
};

enum class Scoring { sigmoid, softmax };
enum class DropPolicy { probs, position };  // which assignments an over-capacity expert keeps
enum class ExpertAct {
    swiglu,  // down(SiLU(gate x) ⊙ up x): 3 matrices (DeepSeek, Kimi)
    relu2,   // down(ReLU(up x)²): 2 matrices (Nemotron LatentMoE)
};

struct MoeConfig {                // routed experts of moe and latent_moe layers (model-math §6-7)
    int n_routed_experts = 0;     // E
    int top_k = 0;                // routed experts per token
    int n_shared_experts = 0;     // always-on experts (run on the full-width x)
    int moe_intermediate = 0;     // I: routed expert width
    int shared_intermediate = 0;  // total shared-expert width (DeepSeek/Kimi: n_shared · I)
    int latent_size = 0;  // ℓ: latent width of latent_moe layers (fc1 [ℓ, d], fc2 [d, ℓ])
    int n_group = 1;      // expert groups for group-limited routing (1 = off)
    int topk_group = 1;   // groups kept per token
    Scoring scoring = Scoring::sigmoid;
    bool renormalize = true;                  // divide the top-k weights by their sum
    double routed_scaling_factor = 1.0;       // ρ: routed weights × ρ
    bool correction_bias = true;              // e_score_correction_bias [E] (selection only)
    bool weights_from_biased_scores = false;  // HF modeling_kimi.py quirk: gather the weights
                                              // from s + b instead of s (model-math §6)
    double capacity_factor = 0.0;             // C = ceil(T·k/E · CF); 0 = dropless
    DropPolicy drop_policy = DropPolicy::probs;
    ExpertAct expert_act = ExpertAct::swiglu;  // routed and shared experts
    bool operator==(const MoeConfig&) const = default;
};

struct VisionConfig {             // MoonViT tower + 2×2 patch merger + projector (model-math §8)
    bool present = false;         // false: text-only model, the other fields are unused
    int patch_size = 14;          // p: pixels per patch side
    int merge = 2;                // patch-merger kernel side (merge × merge patches → 1 token)
    int width = 0;                // C: ViT hidden width
    int n_layer = 0;              // ViT blocks
    int n_head = 0;               // ViT heads (C / n_head divisible by 4 for the 2-D RoPE)
    int mlp = 0;                  // ViT MLP width
    int pos_emb_size = 64;        // side of the learned position table [side, side, C]
    int64_t media_token_id = -1;  // placeholder id replaced by image tokens; −1 = none
    bool operator==(const VisionConfig&) const = default;
};

// How an HF checkpoint stores its matrices (config.json quantization_config; io/safetensors.h
// Fp8Blocks). Not written by to_json: a converted checkpoint holds the dequantized weights.
struct WeightQuant {
    bool fp8 = false;                        // F8_E4M3 weights with "<name>_scale_inv" scales
    int block_rows = 128, block_cols = 128;  // weight_block_size
    bool operator==(const WeightQuant&) const = default;
};

// ---- the model -------------------------------------------------------------------------------

struct ModelConfig {
    std::string model_type;      // "hymoe", "kimi_linear" or "deepseek_v32": the family (which HF
                                 // weight names and routing conventions apply)
    int64_t vocab_size = 0;      // V: embedding rows and head outputs
    int hidden_size = 0;         // d
    int intermediate_size = 0;   // dense (SwiGLU) FFN width; 0 when no layer is dense
    double rms_norm_eps = 1e-5;  // ε of the block and final RMSNorms (and KDA's o_norm)
    int64_t max_position = 0;    // longest supported context in tokens
    bool tie_word_embeddings = false;  // lm_head shares embed_tokens
    int64_t bos_id = -1;               // token ids; −1 = none
    int64_t eos_id = -1;
    int64_t pad_id = -1;
    int n_mtp_layers = 0;  // multi-token-prediction layers present in HF checkpoints; never
                           // run and not counted (DeepSeek-V3.2: 1)
    std::vector<LayerSpec> layers;      // [n_layer] resolved mixer + FFN of every layer
    std::vector<int> stage_boundaries;  // first layer of each pipeline stage after the first
                                        // ('|' in layer_pattern), increasing; empty = none given
    KdaConfig kda;                      // used by Mixer::kda layers
    MlaConfig mla;                      // used by Mixer::mla and Mixer::dsa layers
    IndexerConfig indexer;              // used by Mixer::dsa layers
    MoeConfig moe;                      // used by Ffn::moe and Ffn::latent_moe layers
    VisionConfig vision;
    WeightQuant quant;  // HF configs only
    bool operator==(const ModelConfig&) const = default;
};

// Parameter counts (weights, norm vectors and biases): sums of the weight list
// (model/tensor_list.h, the shapes of model-math §3-8).
struct ParamCount {
    int64_t total = 0;      // every weight of the main model: embedding, head, all layers, all
                            // experts, vision tower (no MTP layers)
    int64_t active = 0;     // weights one text token uses: embedding + head (counted whole), every
                            // attention weight, top_k routed + shared experts, routers
    int64_t embedding = 0;  // embed_tokens + lm_head (lm_head 0 when tied); in total and active
    int64_t vision = 0;     // vision tower + projector; in total, not in active
};

// Reads and validates a config.json (model_type kimi_linear, deepseek_v32 or hymoe).
ModelConfig load_model_config(const std::string& path);
// The same from the file's text (rank 0 reads, broadcasts the bytes, every rank parses);
// `where` names the source in error messages (normally the path).
ModelConfig parse_model_config(const std::string& text, const std::string& where);
// A built-in preset: tiny, tiny-deepseek, tiny-kimi, mid, flagship-2.8t.
ModelConfig preset_config(const std::string& name);
std::vector<std::string> preset_names();

ParamCount count_params(const ModelConfig& cfg);  // defined in tensor_list.cpp
// One paragraph for the log: type, layers by mixer and FFN, sizes, heads, experts, parameters.
std::string describe(const ModelConfig& cfg);
// The config as native hymoe JSON (docs/model-config.md); parse_model_config reads it back to an
// equal ModelConfig except model_type, which becomes "hymoe".
std::string to_json(const ModelConfig& cfg);

// Pattern letters (K kda, M mla, A gated mla, D dsa, G gated dsa; '-' dense, E moe, L latent moe),
// 4 letters per group separated by spaces, '|' at stage boundaries: "KKKG KKKG | KKKG KKKG".
std::string layer_pattern(const ModelConfig& cfg);
std::string ffn_pattern(const ModelConfig& cfg);
int count_layers(const ModelConfig& cfg, Mixer mixer);
int count_layers(const ModelConfig& cfg, Ffn ffn);

// τ of MLA/DSA scores (model-math §4), from MlaConfig::softmax_scale.
double mla_softmax_scale(const MlaConfig& mla);

const char* to_string(Mixer mixer);
const char* to_string(Ffn ffn);
const char* to_string(Scoring scoring);
const char* to_string(DropPolicy policy);
const char* to_string(ExpertAct act);

}  // namespace hymoe::model
