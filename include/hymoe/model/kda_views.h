// The KDA block's weights and per-sequence states as tensor views on any one device, and the
// forward over them (model/kda.h's kda_forward takes the host Buffers and calls these): the same
// code runs on the CPU and, with every view a device tensor, on a CUDA Ctx. Views keep the shapes
// of the weight list (kda_tensors): conv taps [D, 1, W], A_log [1, 1, H, 1]. The conv and the
// recurrence run over the whole batch through its sequence table (backend/kda_batch.h), which a
// caller may build on the device itself (the GPU model, whose decode graphs capture the forward).
// Invariant: every tensor and table pointer of one call lives on ctx.device; host adapters
// (LoraSlots) run on CPU contexts, factor views (lora_views.h) on any.
#pragma once

#include <vector>

#include "hymoe/backend/kda_batch.h"
#include "hymoe/model/kda.h"
#include "hymoe/model/lora_views.h"

namespace hymoe::model {

struct KdaWeightViews {
    Tensor q_proj, k_proj, v_proj;        // [D, d]
    Tensor q_conv1d, k_conv1d, v_conv1d;  // [D, 1, W]
    Tensor f_a_proj;                      // [K, d]
    Tensor f_b_proj;                      // [D, K]
    Tensor dt_bias;                       // [D]
    Tensor a_log;                         // [1, 1, H, 1]
    Tensor b_proj;                        // [H, d]
    Tensor g_a_proj;                      // [K, d]
    Tensor g_b_proj;                      // [D, K]
    Tensor o_norm;                        // [K]
    Tensor o_proj;                        // [d, D]
    const LoraSlots* lora = nullptr;      // host adapters on q, k, v, o; null: none
    MixerLoraViews lora_views;            // adapters as factor views on q, k, v, o
};
KdaWeightViews kda_views(const KdaWeights& w);

struct KdaStateViews {
    Tensor S;                       // [H, K, V] fp32
    Tensor q_tail, k_tail, v_tail;  // [W−1, D]
};
KdaStateViews kda_views(KdaState& st);

// The host arrays of a batch's sequence table over per-sequence state views (their pointers, on
// whichever device the views are): table() points into them (host memory); kda_forward copies
// them to its Ctx's device.
struct KdaTableArrays {
    std::vector<int64_t> offsets;  // [n_seq + 1] the batch's
    std::vector<int32_t> row_seq;  // [n_tok]
    std::vector<float*> ptrs;      // [4, n_seq] S, then the q, k and v tails
    int64_t n_tok = 0, max_len = 0;
    ops::KdaSeqTable table() const;
};
KdaTableArrays kda_table_arrays(const SeqBatch& batch, const std::vector<KdaStateViews>& states);
// The table of `arrays` on ctx's device, its arrays copied into scratch (freed with it).
ops::KdaSeqTable kda_table_on(const backend::Ctx& ctx,
                              backend::Scratch& scratch,
                              const KdaTableArrays& arrays);

// Fails (Exit::internal) unless every state is make_kda_state's for cfg.
void check_kda_states(const ModelConfig& cfg, const std::vector<KdaStateViews>& states);

// One kda_forward call's batch on ctx's device: the host's SeqBatch (checks; host adapters), its
// sequence table (states and tails in ctx's memory) and, for factor-view adapters, each adapter's
// rows (null: none).
struct KdaBatchViews {
    const SeqBatch* batch = nullptr;
    ops::KdaSeqTable table;
    const std::vector<LoraRowsView>* lora_rows = nullptr;
};

// kda_forward (model/kda.h) on views: y [n_tok, d] from x [n_tok, d]; states[s] continued in place.
void kda_forward(const backend::Ctx& ctx,
                 const ModelConfig& cfg,
                 const KdaWeightViews& w,
                 const Tensor& x,
                 const SeqBatch& batch,
                 const std::vector<KdaStateViews>& states,  // [n_seq]
                 Tensor& y,
                 KdaMode mode = KdaMode::automatic);
// The same with the batch's table already on ctx's device.
void kda_forward(const backend::Ctx& ctx,
                 const ModelConfig& cfg,
                 const KdaWeightViews& w,
                 const Tensor& x,
                 const KdaBatchViews& b,
                 Tensor& y,
                 KdaMode mode = KdaMode::automatic);

}  // namespace hymoe::model
