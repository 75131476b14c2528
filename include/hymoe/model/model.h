// The whole language model on one rank: embedding → layers (h += mixer(RMSNorm₁ h);
// h += ffn(RMSNorm₂ h)) → final RMSNorm → LM head. Each layer's mixer and FFN are dispatched by the
// annotation resolved once in ModelConfig::layers. The forward takes a packed batch of sequences
// (model/batch.h) and their per-sequence states, so prefill (whole prompts or chunks) and
// step-decode share all block code. Weight names are the HF names of the config's family.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "hymoe/model/attention.h"
#include "hymoe/model/batch.h"
#include "hymoe/model/config.h"
#include "hymoe/model/ffn.h"
#include "hymoe/model/kda.h"

namespace hymoe::model {

struct LayerWeights {
    Buffer attn_norm;       // [d] input_layernorm.weight
    Buffer ffn_norm;        // [d] post_attention_layernorm.weight
    KdaWeights kda;         // Mixer::kda layers
    MlaWeights attn;        // Mixer::mla and Mixer::dsa layers
    DenseFfnWeights dense;  // Ffn::dense layers
    MoeWeights moe;         // Ffn::moe and Ffn::latent_moe layers
};

struct Model {
    ModelConfig cfg;
    Buffer embed;                      // [V, d] model.embed_tokens.weight
    std::vector<LayerWeights> layers;  // [n_layer]
    Buffer final_norm;                 // [d] model.norm.weight
    Buffer lm_head;                    // [V, d] lm_head.weight (empty when tied: embed is used)
    const Buffer& head() const { return cfg.tie_word_embeddings ? embed : lm_head; }
};

// Every weight of the model with its full HF name ("model.layers.3.self_attn.q_proj.weight").
TensorList model_tensors(Model& m);
// An empty model for cfg (no weights yet): fill with init_model_random or load_model_weights.
Model make_model(const ModelConfig& cfg);
// init: random. Each tensor draws from its own Philox stream keyed by (seed, its name), so the
// weights do not depend on the order tensors are listed in or on the layout.
void init_model_random(Model& m, uint64_t seed);
// Fill every tensor by name (safetensors folder, checkpoint, golden file).
void load_model_weights(Model& m,
                        const std::function<void(const std::string& name, Tensor& dest)>& read);

// What one sequence carries between forward calls: per layer, the KDA state or the attention
// cache (whichever that layer's mixer needs), and how many tokens it has seen.
struct SequenceState {
    std::vector<KdaState> kda;    // [n_layer]; filled for kda layers only
    std::vector<AttnCache> attn;  // [n_layer]; used by mla/dsa layers only
    int64_t n_tokens = 0;
};
SequenceState make_sequence_state(const ModelConfig& cfg);

enum class Logits { all, last };  // every token's row, or only each sequence's last

// Wall seconds per layer, summed over the forward calls that were given it (profiles, benches).
struct ForwardStats {
    std::vector<double> mixer_seconds;  // [n_layer] KDA or MLA/DSA, including its projections
    std::vector<double> ffn_seconds;    // [n_layer] dense FFN or MoE
    AttnStats attn;                     // MLA/DSA layers: indexer vs the rest
    double head_seconds = 0;            // embedding, final norm and LM head
};

struct ForwardOptions {
    Logits logits = Logits::all;
    KdaMode kda_mode = KdaMode::automatic;
    AttnMode attn_mode = AttnMode::automatic;
    ForwardStats* stats = nullptr;  // filled when given
};

// tokens [n_tok] packed as batch; states [n_seq] advance by each sequence's length (batch.pos0
// must equal their n_tokens). logits is resized to [n_tok, V] (Logits::all) or [n_seq, V].
void forward(const Model& m,
             const std::vector<int64_t>& tokens,
             const SeqBatch& batch,
             const std::vector<SequenceState*>& states,
             Buffer& logits,
             const ForwardOptions& options = {});

}  // namespace hymoe::model
