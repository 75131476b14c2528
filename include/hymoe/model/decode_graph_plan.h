// The host side of the GPU model's decode graphs (model/device_model.h,
// DeviceModelOptions::graphs): which steps may replay a captured CUDA graph, the graph a step uses
// (its batch bucket and key bucket), and the step's metadata packed into the one byte block that a
// single copy moves to the graph's fixed device buffer. Plain C++ in every build
// (src/model/decode_graph_plan.cpp, unit-tested on the CPU:
// tests/unit/model/test_decode_graph_plan.cpp); the graphs themselves are
// src/model/cuda/device_decode_graphs.{h,cpp}.
// A graph runs B = the bucket of the batch's n sequences (backend/cuda_graph.h DecodeBuckets):
// rows n .. B−1 are padding, a reserved dummy sequence (token 0 at position 0, one key, a
// reserved KV page and a scratch KDA state), whose outputs are dropped. Attention decode sizes its
// score buffer [B, H, max_keys] on the host, so a graph is also keyed by the key bucket (max_keys
// rounded up to a power of two, kMinKeyBucket at least); the kernels read each row's own key
// count from the device arrays.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "hymoe/backend/cuda_graph.h"
#include "hymoe/core/types.h"
#include "hymoe/model/batch.h"
#include "hymoe/model/config.h"
#include "hymoe/model/model.h"

namespace hymoe::model {

// ---- eligibility ------------------------------------------------------------------------------

constexpr int64_t kMinKeyBucket = 256;
// max_keys (≥ 1) rounded up to a power of two, kMinKeyBucket at least.
int64_t key_bucket(int64_t max_keys);

// What the GPU model fixes at its construction.
struct DecodeGraphModel {
    bool graphs = false;         // DeviceModelOptions::graphs
    bool fused = false;          // DeviceModelOptions::fused
    DType dtype = DType::bf16;   // its matrices
    bool kda_slots = false;      // KDA states are slots of one pool (the fused decode's addressing)
    int n_sm = 0;                // the device's SMs (the fused DSA plans split keys by them)
    int64_t max_key_bucket = 0;  // the largest key bucket whose scores the workspace holds
    int n_adapters = 0;          // LoRA adapters held (DeviceModel::set_lora_adapters)
    int ep = 1;                  // the expert-parallel group its MoE layers dispatch over
};

// Why a step runs eagerly (none: it may replay a graph). A DSA layer qualifies on the fused
// indexer_topk + mla_sparse path (model/fused_step.h dsa_fused_plan for B rows of up to
// key-bucket visible keys, bf16): its shapes then follow the graph's, not the step's key counts.
enum class GraphRefusal {
    none,
    off,         // graphs or the fused kernels switched off
    ep,          // MoE layers dispatch over an ep group (NCCL, sized on the host each layer)
    stats,       // ForwardOptions::stats: timings need synchronisations
    forms,       // ForwardOptions::kda_mode or attn_mode other than automatic (the eager step's)
    media,       // image rows spliced in
    lora,        // some sequence uses a LoRA adapter (model/lora.h's choice) the model holds
    not_decode,  // some sequence has other than one row (prefill, mixed), or no sequence
    too_many,    // more sequences than the largest bucket
    kda,         // a KDA layer would not run the fused decode kernel
    moe,         // an MoE layer off the fused kernels at the bucket's size (moe_parallel.h
                 //   moe_runs_fused): it would route on the host
    dsa,         // a DSA layer off the fused kernels at the graph's sizes (B rows, key bucket)
    kv_store,    // the KV pages are not plainly resident on the device (or not one store)
    keys,        // the key bucket's scores do not fit the workspace
};
const char* to_string(GraphRefusal r);

// The step (tokens packed as batch) as forward receives it; kv_resident: its sequences page into
// one store whose every page stays in device memory throughout (no host tier).
GraphRefusal decode_graph_refusal(const ModelConfig& cfg,
                                  const DecodeGraphModel& model,
                                  const backend::cuda::DecodeBuckets& buckets,
                                  const SeqBatch& batch,
                                  const ForwardOptions& options,
                                  bool kv_resident);

// ---- metadata ---------------------------------------------------------------------------------

// Block-table columns a graph of key bucket `keys` gives each row.
inline int64_t table_width(int64_t keys, int page_tokens) {
    return std::max<int64_t>((keys + page_tokens - 1) / page_tokens, 1);
}

// One graph's metadata: arrays at fixed byte offsets (multiples of 16) of one block, for B rows,
// block tables `max_pages` wide and n_kda KDA layers. The one-row arrays of StepBatch coincide
// with the full ones in a pure decode step (one_table = block_table, one_rows = 0 .. B−1).
struct DecodeMetaLayout {
    int64_t rows = 0;       // B
    int64_t max_pages = 0;  // block-table width
    int64_t n_kda = 0;
    size_t tokens = 0;       // i64 [B] token ids
    size_t positions = 0;    // i64 [B]
    size_t offsets = 0;      // i64 [B + 1] = 0 .. B
    size_t one_rows = 0;     // i64 [B] = 0 .. B−1
    size_t row_seq = 0;      // i32 [B] = 0 .. B−1
    size_t one_keys = 0;     // i32 [B] keys after the step
    size_t block_table = 0;  // i32 [B, max_pages]
    size_t kda_states = 0;   // i64 [4, n_kda, B] S pointers, then q, k, v conv-tail pointers
    size_t kda_slots = 0;    // i32 [n_kda, B] S slots
    size_t bytes = 0;
};
DecodeMetaLayout decode_meta_layout(int64_t rows, int64_t max_pages, int64_t n_kda);

// A sequence's KDA block on the device (src/model/device/device_model_impl.h DeviceSequence): its
// n_kda layers' S of s_floats floats each, then their conv tails of tail_floats each (three planes
// q, k, v of tail_floats / 3).
struct KdaBlockShape {
    int64_t n_kda = 0, s_floats = 0, tail_floats = 0;
};

// One row of a decode step: a sequence and its next token.
struct DecodeRow {
    int64_t token = 0;
    int64_t position = 0;                         // its cached tokens before the step
    const std::vector<int32_t>* pages = nullptr;  // its block table (null: no attention layer)
    uint64_t kda_state = 0;                       // device address of its layer-0 S
    int32_t kda_slot = 0;                         // that S's slot; layer j's is kda_slot + j
};

// The dummy sequence of padded rows: the page its one key is written to and read from, and its
// KDA block.
struct DecodePadding {
    int32_t page = 0;
    uint64_t kda_state = 0;
    int32_t kda_slot = 0;
};

// Fills the layout's block at dst (layout.bytes) for `rows` (at most layout.rows; the rest
// padding). Checks each row's block table covers its keys and fits the width.
void pack_decode_meta(const DecodeMetaLayout& layout,
                      const KdaBlockShape& kda,
                      int page_tokens,
                      const std::vector<DecodeRow>& rows,
                      const DecodePadding& pad,
                      void* dst);

}  // namespace hymoe::model
