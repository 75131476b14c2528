// Named weight tensors (llama.cpp's "create the named tensors with their shapes"). Every block's
// *Weights struct lists its tensors once, as (name, shape, destination, init rule); the same list
// drives loading from safetensors (HF names), reading golden test files and random init.
// Storage: the matrices (rank 2, Init::normal: every projection, expert, embedding and head,
// indexer and vision matrix) are held at the model's storage dtype (model.dtype: bf16, fp16 or
// fp32; TensorSpec::dtype, set by model_tensors) and multiplied through ops::gemm_w; everything
// else (norms, biases, conv kernels, A_log, dt_bias, LoRA adapters, the router gate: keep_f32)
// stays fp32. docs/guide/precision.md states the rule and what is computed in what.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "hymoe/core/rng.h"
#include "hymoe/tensor/tensor.h"

namespace hymoe::model {

// How `init: random` fills a tensor (fla / DeepSeek / HF initialisations).
enum class Init {
    normal,       // N(0, std), std = 0.02 unless given (HF initializer_range)
    ones,         // norm weights
    zeros,        // biases
    kda_a_log,    // log U(1, 16)                                      (fla KDA)
    kda_dt_bias,  // inverse softplus of dt = exp(U(log 1e-3, log 1e-1)) clamped ≥ 1e-4
    small_bias,   // 0.1 · N(0, 1): MoE e_score_correction_bias in the tiny test config
    uniform,      // U(−std, std): LoRA A, Kaiming-uniform with std = 1/√in (PEFT)
};

// Which ranks cut a split tensor between them (model/shard.h): the tp group (attention and KDA
// heads, dense FFN and shared-expert width, vocabulary) or the etp group (routed expert width).
enum class SplitOver { tp, etp };

// The part of the model a weight belongs to (the plan's weights by block: runtime/plan.h's
// PlanBlock is this enum).
enum class WeightBlock {
    embedding,       // embed_tokens [V/tp, d]
    head,            // lm_head [V/tp, d], or a tied head's copy of the embedding on its own stage
    kda,             // KDA mixers
    mla,             // MLA/DSA attention incl. the output gate (indexer separate)
    indexer,         // DSA lightning indexers
    dense_ffn,       // dense SwiGLU layers
    router,          // MoE gate [E, d] + correction bias
    routed_experts,  // E/ep experts per rank, each 1/etp
    shared_experts,  // shared experts over tp
    latent_proj,     // latent MoE fc1 [ℓ, d] + fc2 [d, ℓ]
    norms,           // block RMSNorms + final norm
    vision,          // vision tower + projector
};

struct TensorSpec {
    std::string name;  // HF name relative to the block, e.g. "q_proj.weight"
    Shape shape;       // this rank's part: the full shape with shape[split_dim] divided
    Buffer* dest;      // null in a description without weights (model/tensor_list.h)
    Init init = Init::normal;
    float std = 0.02f;
    int split_dim = -1;  // the dim cut into equal contiguous parts, part i on rank i of the
                         // group; −1: every rank holds the whole tensor
    SplitOver split_over = SplitOver::tp;
    bool keep_f32 = false;     // fp32 whatever the storage dtype (precision-critical: the router)
    DType dtype = DType::f32;  // held at: set by with_storage
    WeightBlock block = WeightBlock::norms;
    int64_t count = 1;  // equal tensors it stands for: a layer's routed experts, stacked in a
                        // description without weights (one spec per expert when bound)
    int64_t numel() const { return count * shape_numel(shape); }
};

// &(w->*member), or null when describing without weights (w null).
template <class W>
Buffer* slot(W* w, Buffer W::*member) {
    return w ? &(w->*member) : nullptr;
}

// spec, marked as cut along `dim` (0: a column-parallel [out, in] weight, its output rows split;
// 1: a row-parallel one, its input columns split) over `over`.
inline TensorSpec split(int dim, TensorSpec spec, SplitOver over = SplitOver::tp) {
    spec.split_dim = dim;
    spec.split_over = over;
    return spec;
}

using TensorList = std::vector<TensorSpec>;

// list with every spec's block set to b.
TensorList in_block(WeightBlock b, TensorList list);

// Whether spec is a matrix held at the storage dtype: rank 2, Init::normal, not keep_f32.
bool stored_matrix(const TensorSpec& spec);
// list with every stored matrix's dtype set to `storage` (the others fp32).
TensorList with_storage(TensorList list, DType storage);
// x [n] at dtype t from fp32 (bf16/fp16: round to nearest even); the element type's bytes.
void store_floats(const float* x, int64_t n, DType t, void* dst);
// x [n] = the fp32 values of src [n] at float dtype t (16-bit: exact).
void load_floats(const void* src, int64_t n, DType t, float* x);
// The fp32 values of a float weight (a copy; widened when held in 16 bits).
std::vector<float> widened(const Tensor& w);

// Allocate every tensor of the list (at spec.dtype, zeroed) and fill it by its init rule,
// advancing `rng` in list order: drawn in fp32, then rounded to spec.dtype (so a bf16 model's
// fp32 twin is its widened weights). Whole tensors only (split_dim is not read): the model gives
// each tensor its own stream and cuts a rank's part out of the whole (model.h init_model_random),
// which is what makes the weights the same on every layout.
void init_random(const TensorList& list, Philox& rng);
// Allocate every tensor and fill it with read(prefix + name, dest) (safetensors, golden files).
void load_named(const TensorList& list,
                const std::string& prefix,
                const std::function<void(const std::string& name, Tensor& dest)>& read);

}  // namespace hymoe::model
