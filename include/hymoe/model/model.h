// The language model, whole on one rank or cut over tp, ep, etp and pp (model/shard.h): embedding →
// layers (h += mixer(RMSNorm₁ h); h += ffn(RMSNorm₂ h)) → final RMSNorm → LM head. Each layer's
// mixer and FFN are dispatched by the annotation resolved once in ModelConfig::layers. The forward
// takes a packed batch of sequences (model/batch.h) and their per-sequence states, so prefill
// (whole prompts or chunks) and step-decode share all block code. Weight names are the HF names of
// the config's family. Under model parallelism every rank of a dp replica calls forward with the
// same batch: the stages pass the residual stream point to point, tp ranks all-reduce each mixer's
// and dense FFN's partial output, MoE layers dispatch over ep (model/moe_parallel.h), and the
// vocab-parallel head's logits are gathered over tp, so every rank of the last stage holds the full
// logits.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "hymoe/backend/ctx.h"
#include "hymoe/model/attention.h"
#include "hymoe/model/batch.h"
#include "hymoe/model/config.h"
#include "hymoe/model/ffn.h"
#include "hymoe/model/kda.h"
#include "hymoe/model/kv_cache.h"
#include "hymoe/model/moe_parallel.h"
#include "hymoe/model/shard.h"
#include "hymoe/model/vision.h"
#include "hymoe/parallel/comms.h"

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
    ModelConfig cfg;    // the whole model
    ModelShard shard;   // this rank's part
    ModelConfig local;  // the head counts and widths this rank's blocks run on (cfg on one rank)
    const parallel::Comms* comms = nullptr;  // null: one rank
    backend::Ctx ctx;  // the device the blocks' ops run on (backend/ctx.h): the CPU (a model
                       //   on a GPU is model/device_model.h's, over uploaded weights)
    DType weight_dtype = DType::f32;   // the matrices' storage (model.dtype; weights.h)
    Buffer embed;                      // [V/tp, d] model.embed_tokens.weight (first stage; the
                                       //   last too when tied)
    std::vector<LayerWeights> layers;  // [n_layer], filled for this stage's layers only
    Buffer final_norm;                 // [d] model.norm.weight (last stage)
    Buffer lm_head;                    // [V/tp, d] lm_head.weight (last stage; empty when tied)
    VisionWeights vision;              // vision tower + projector (first stage, replicated over
                                       //   its tp ranks; when cfg.vision.present)
    const Buffer& head() const { return cfg.tie_word_embeddings ? embed : lm_head; }
};

// The Philox stream of a name (32-bit FNV-1a): a tensor's random init, an adapter's dropout, the
// same whichever ranks hold them.
uint32_t name_stream(const std::string& name);

// This rank's weights with their full HF names ("model.layers.3.self_attn.q_proj.weight") and
// local shapes: weight_list (model/tensor_list.h) bound to m's buffers, each hosted routed expert
// its own spec (MoeWeights::expert_rank's placement); split_dim says how each is cut from the
// whole tensor, dtype how it is held (m.weight_dtype for the matrices, weights.h).
TensorList model_tensors(Model& m);
// An empty model for cfg (no weights yet): fill with init_model_random or load_model_weights.
Model make_model(const ModelConfig& cfg);
// The part of the grid's rank (layout validated against cfg first: runtime/job.h). The grid
// must outlive the model.
Model make_model(const ModelConfig& cfg, const parallel::Grid& grid);
// init: random. Each tensor draws from its own Philox stream keyed by (seed, its name), whole,
// and the rank keeps its part, so the weights do not depend on the tensor order or the layout.
void init_model_random(Model& m, uint64_t seed);
// Reads this rank's part of one tensor: the whole tensor when part.dim < 0, else the slice
// [begin, begin + dest.shape[dim]) along dim of a tensor whose dim is `full` long.
struct TensorPart {
    int dim = -1;
    int64_t begin = 0, full = 0;
};
// The part of a tensor of this rank's list that `shard` holds (dim −1: the whole tensor).
TensorPart part_of(const TensorSpec& spec, const ModelShard& shard);
using ReadTensor =
    std::function<void(const std::string& name, const TensorPart& part, Tensor& dest)>;
// Fill every tensor by name (safetensors folder, checkpoint, golden file).
void load_model_weights(Model& m, const ReadTensor& read);
// The same two fills for some of this rank's tensors (a list from model_tensors or
// expert_tensors): random init gives each tensor the values init_model_random would.
void init_tensors_random(const TensorList& list, const ModelShard& shard, uint64_t seed);
void load_tensors(const TensorList& list, const ModelShard& shard, const ReadTensor& read);
// The matrices of routed experts `experts` of MoE layer `layer` on this rank (full names).
TensorList expert_tensors(Model& m, int layer, const std::vector<int>& experts);

struct DeviceSequence;  // a sequence's state on a GPU (model/device_model.h)

// What one sequence carries between forward calls: per layer, the KDA state or the attention
// cache (whichever that layer's mixer needs), and how many tokens it has seen.
struct SequenceState {
    std::vector<KdaState> kda;    // [n_layer]; filled for kda layers only (host forward)
    std::vector<AttnCache> attn;  // [n_layer]; used by mla/dsa layers only
    int64_t n_tokens = 0;
    std::vector<int32_t> pages;  // block table in a KvPool (attach_kv_pool), for all its layers
    std::shared_ptr<DeviceSequence> device;  // a DeviceModel's sequence: its KDA states live
                                             //   there instead of in kda; null on the host
};
// A new sequence on this rank: the states of its stage's KDA layers, with its heads.
SequenceState make_sequence_state(const Model& m);
// The state's MLA/DSA caches page into `pool` through s.pages (model/kv_cache.h). s must not move
// afterwards (the caches point at s.pages).
void attach_kv_pool(const Model& m, SequenceState& s, KvPool& pool);

// A prompt's prefill may stop after a token n and go on later from the sequence's state with every
// row computed as in one call when n's offset in its call is a multiple of this: the KDA chunks
// (kda_chunked's 64 tokens) and the attention query blocks (256 queries) of the rows after n then
// start where they would have (their GEMM row counts aside: ops::set_batch_invariant). The prefix
// cache stops at such points only (runtime/prefix_cache.h).
constexpr int64_t kPrefillAlign = 256;

enum class Logits { all, last };  // every token's row, or only each sequence's last

// Wall seconds per layer, summed over the forward calls that were given it (profiles, benches).
struct ForwardStats {
    std::vector<double> mixer_seconds;  // [n_layer] KDA or MLA/DSA, including its projections
    std::vector<double> ffn_seconds;    // [n_layer] dense FFN or MoE
    AttnStats attn;                     // MLA/DSA layers: indexer vs the rest
    std::vector<double> layer_flops;    // [n_layer] GEMM FLOPs of the mixer and FFN
    int64_t steps = 0;                  // forward calls with tokens (each reads every weight)
    double head_seconds = 0;            // embedding, final norm and LM head
    double pipeline_seconds = 0;        // waiting for the previous stage's residual stream (pp)
    std::vector<MoeCommStats> moe;      // [n_layer] MoE layers: tokens per hosted expert and,
                                        //   under tp/ep, the dispatch and combine phases
    VisionStats vision;                 // the vision encoder (runtime: images at admission)
    // [n_layer] of the mixer + FFN seconds, those inside ops::gemm (the rest: non-GEMM work)
    std::vector<double> layer_gemm_seconds;
};

// Image tokens spliced into a forward's embeddings (model-math §8): after embed_tokens, row
// rows[i] of the packed batch is replaced by embeds row i. First stage only.
struct MediaSplice {
    std::vector<int64_t> rows;  // [n_media] token rows of the batch, each a placeholder token
    Buffer embeds;              // [n_media, d] projected image tokens
};

struct ForwardOptions {
    Logits logits = Logits::all;
    KdaMode kda_mode = KdaMode::automatic;
    AttnMode attn_mode = AttnMode::automatic;
    ForwardStats* stats = nullptr;       // filled when given
    Buffer* stage_out = nullptr;         // not the last stage: when given, the residual stream is
                                         // left here for send_to_next_stage() instead of sent
    const MediaSplice* media = nullptr;  // image tokens replacing placeholder rows (first stage)
};

// tokens [n_tok] packed as batch; states [n_seq] advance by each sequence's length (batch.pos0
// must equal their n_tokens). logits is resized to [n_tok, V] (Logits::all) or [n_seq, V] on the
// last stage, left empty on the others. Collective over the rank's tp, pp and ep groups: a rank
// with no tokens (n_tok = 0) still calls it while others in its ep group have work.
void forward(const Model& m,
             const std::vector<int64_t>& tokens,
             const SeqBatch& batch,
             const std::vector<SequenceState*>& states,
             Buffer& logits,
             const ForwardOptions& options = {});

// Starts sending a residual stream left in ForwardOptions::stage_out to the next stage (nothing
// when it is empty or this is the last stage). h must stay untouched until the Request completes.
comm::Request send_to_next_stage(const Model& m, const Buffer& h);

}  // namespace hymoe::model
