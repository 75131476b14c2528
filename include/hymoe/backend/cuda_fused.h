// Fused GPU kernels (issue 13): KDA's chunked prefill with the WY intermediates in shared memory
// and its batched decode step; DSA's fused indexer top-k and sparse MLA attention over the
// selected latent rows; the MoE layer's routing, dispatch plan, grouped expert GEMMs and
// combine. The CPU ops are the reference (tests/cuda). Tensor-core products take bf16 operands
// and accumulate in fp32; states, scores, softmax statistics and reductions stay fp32.
// The plans (tiling, shared-memory layouts, split counts, grid bounds) are plain C++ in every
// build (src/backend/fused_plan.cpp, unit-tested on the CPU); the kernels exist in CUDA builds
// only (src/backend/cuda/{kda_chunk,kda_decode,indexer_topk,mla_sparse,moe_route,moe_gemm}.cu).
// Every pointer in a params struct is a device pointer; calls are asynchronous on `s` and never
// wait for the device, so a decode step made of them can be captured in a CUDA graph.
#pragma once

#include <cstdint>
#include <limits>

#include "hymoe/backend/cuda_arena.h"
#include "hymoe/core/types.h"

namespace hymoe::backend::cuda {

// The most shared memory one block may use on sm_90 (227 KiB), and what the plans allow a
// block's dynamic shared memory, leaving 1 KiB for its static variables.
constexpr int kMaxSmemPerBlock = 232448;
constexpr int kDynamicSmemLimit = kMaxSmemPerBlock - 1024;

// ---- KDA -------------------------------------------------------------------------------------

constexpr int kKdaChunk = 64;  // C: tokens per chunk
constexpr int kKdaSub = 16;    // rows per sub-block (secondary chunking) of a chunk

// Where the chunk kernel keeps its tiles: byte offsets into dynamic shared memory and row
// strides in elements. Per chunk the kernel runs in phases, and regions of different phases
// share bytes (the phase list is the kernel's, src/backend/cuda/kda_chunk.cu):
//   stage / factors / triangles:  a32 q16 k16 | qi16 ki16 r16 | akk32 aqk32
//   chunk factors:                a32 q16 k16 | qg16 kg16 kl16 | akk32 aqk32
//   solve / products:             t16 aqk16 w16 vp16 v16 x32 | qg16 kg16 kl16 | akk32 aqk32(=N)
// with s32 s16 beta dec live throughout.
struct KdaChunkLayout {
    bool supported = false;
    const char* why = nullptr;  // when not supported
    int d_k = 0;                // K
    int bv = 0;                 // value columns per block (the grid splits V into V / bv blocks)
    int ld_k = 0;               // bf16 tiles of K columns
    int ld_c = 0;               // bf16 tiles of C columns
    int ld_v = 0;               // bf16 tiles of bv columns
    int ld_cf = 0;              // fp32 [C, C] tiles
    int ld_s = 0;               // fp32 state [K, bv]
    int a32 = 0;                // [C, K] fp32 e^g
    int q16 = 0;                // [C, K] q
    int k16 = 0;                // [C, K] k
    int qi16 = 0;               // [C − 16, K] q ⊙ e^{Γ_i − Γ_ref} of sub-blocks 1..3
    int ki16 = 0;               // [C − 16, K] k ⊙ e^{Γ_i − Γ_ref} of sub-blocks 1..3
    int r16 = 0;    // [6·16, K] k ⊙ e^{Γ_ref − Γ_j} for each sub-block pair (I > J)
    int qg16 = 0;   // [C, K] q ⊙ e^Γ
    int kg16 = 0;   // [C, K] k ⊙ e^Γ
    int kl16 = 0;   // [C, K] k ⊙ e^{Γ_last − Γ}
    int akk32 = 0;  // [C, C] fp32 k·k products, then M
    int aqk32 = 0;  // [C, C] fp32 q·k products, then N = (I + M)^{-1}
    int t16 = 0;    // [C, C] T = N Diag(β)
    int aqk16 = 0;  // [C, C] Aqk
    int w16 = 0;    // [C, K] −W
    int vp16 = 0;   // [C, bv] V'
    int v16 = 0;    // [C, bv] v
    int x32 = 0;    // [3, 16, 16] fp32 solve scratch
    int s32 = 0;    // [K, bv] fp32 state
    int s16 = 0;    // [K, bv] the state as an operand
    int beta = 0;   // [C] fp32
    int dec = 0;    // [K] fp32 e^{Γ_last}
    int bytes = 0;  // dynamic shared memory of a block
};
// The chunk kernel's layout for d_k, d_v: supported for d_k a multiple of 16 up to 128 and d_v a
// multiple of 32 (bv = 64 when d_v allows, else 32), within kDynamicSmemLimit.
KdaChunkLayout kda_chunk_layout(int d_k, int d_v);

// A batch of sequences for the KDA recurrence (ops::kda_recurrent's arithmetic, spec §3), all
// heads: rows of the per-token arrays are tokens, heads contiguous within a row. The states live
// in a pool of slots so that a graph-captured decode step reads them in place.
struct KdaBatchParams {
    int n_seq = 0;                        // B
    int n_head = 0;                       // H
    int d_k = 0;                          // K
    int d_v = 0;                          // V
    DType dtype = DType::f32;             // q, k, v, o storage: f32 or bf16
    const int64_t* seq_start = nullptr;   // [B + 1] prefill: sequence b owns token rows
                                          //   [seq_start[b], seq_start[b + 1]); decode: unused
                                          //   (row b is sequence b's one token)
    const int32_t* state_slot = nullptr;  // [B] pool slot of each sequence, or null: slot b
    const void* q = nullptr;              // [n_tok, H, K] l2-normalised, scaled by K^{-1/2}
    const void* k = nullptr;              // [n_tok, H, K] l2-normalised
    const void* v = nullptr;              // [n_tok, H, V]
    const float* g = nullptr;             // [n_tok, H, K] log-decay, ≤ 0
    const float* beta = nullptr;          // [n_tok, H]
    float* S = nullptr;                   // [n_slots, H, K, V] fp32 states, in and out
    void* o = nullptr;                    // [n_tok, H, V]
};

// ---- DSA -------------------------------------------------------------------------------------

// Where key row u of sequence b lives: with a block table, page block_table[b·max_pages +
// u / page_tokens] at `rows + page·page_stride + (u % page_tokens)·row_stride` (elements);
// without one, `rows + u·row_stride` (a single sequence).
struct PagedRows {
    const void* rows = nullptr;
    DType dtype = DType::f32;  // f32 or bf16
    int64_t row_stride = 0;
    int64_t page_stride = 0;
    int page_tokens = 1;
    const int32_t* block_table = nullptr;  // [n_seq, max_pages] or null
    int max_pages = 0;
};

// The indexer's plan: queries per block (2 when the launch is one sequence, so they share key
// tiles), key-range splits per query (so a short batch of long-context queries fills the GPU;
// the splits' candidates are merged by a second kernel), the candidate buffer per query (a power
// of two ≥ top_k + key_tile) and the shared memory and scratch they need.
struct IndexerPlan {
    bool supported = false;
    const char* why = nullptr;
    int n_q = 0, n_head = 0, d = 0, top_k = 0;  // planned for: a call may have fewer queries
    int queries_per_block = 1;
    int n_split = 1;
    int key_tile = 64;
    int capacity = 0;           // candidate entries per query in shared memory
    int ld_q = 0;               // row stride (elements) of the bf16 query and key tiles
    int ld_logit = 0;           // row stride of the fp32 weighted-logit tile
    int q_off = 0;              // [queries_per_block·H_I, d] bf16 queries
    int k_off = 0;              // [key_tile, d] bf16 keys
    int logit_off = 0;          // [queries_per_block·H_I, key_tile] fp32 w_j · ReLU(q_j · k)
    int cand_off = 0;           // [queries_per_block, capacity] 64-bit (score, key) candidates
    int w_off = 0;              // [queries_per_block·H_I] fp32 head weights
    int smem_bytes = 0;         // of the scoring kernel
    int merge_smem_bytes = 0;   // of the merge kernel (n_split > 1)
    int64_t scratch_bytes = 0;  // [n_q, n_split, top_k] 64-bit candidates (n_split > 1)
};
IndexerPlan indexer_topk_plan(
    int n_q, int max_visible, int n_head, int d, int top_k, bool one_sequence, int n_sm);

// The lightning indexer and its top-k fused (ops::indexer_scores + ops::top_k on the causal
// prefix): for query r, I(r, u) = Σ_j w[r, j] · ReLU(q[r, j] · k_u) over keys u < visible[r],
// and idx[r] = the min(top_k, visible[r]) best keys, best first, ties to the smaller key, −1
// after them. Scores are streamed through key tiles into a per-query candidate buffer in shared
// memory (admitting only scores above the running k-th best), never stored whole. q · k uses
// bf16 operands (exact products, fp32 sums).
struct IndexerTopkParams {
    int n_q = 0;
    int n_head = 0;  // H_I (queries_per_block · H_I a multiple of 16)
    int d = 0;       // d_I (a multiple of 16)
    int top_k = 0;
    DType q_dtype = DType::f32;        // f32 or bf16
    const void* q = nullptr;           // [n_q, H_I·d_I]
    const float* w = nullptr;          // [n_q, H_I] head weights, scale included
    const int32_t* visible = nullptr;  // [n_q] keys each query ranks
    const int32_t* seq = nullptr;      // [n_q] block-table row of each query, or null: 0
    PagedRows keys;                    // the indexer keys [.., d_I]
    int32_t* idx = nullptr;            // [n_q, top_k]
    void* scratch = nullptr;           // plan.scratch_bytes
};

// Sparse MLA in the absorbed (MQA) form over each query's selected latent rows (FlashMLA's
// sparse decode): s_h(u) = τ · q̂_h · [c_kv | k_r]_u over the valid entries u of the query's list
// (0 ≤ u < visible), ō_h = Σ_u softmax(s_h)_u · c_kv_u; ō = 0 when no entry is valid. A block
// takes one query and 16·row_blocks heads; each key tile is gathered once into shared memory
// for all of them, scores and ō accumulate on tensor cores with an online softmax.
struct MlaSparsePlan {
    bool supported = false;
    const char* why = nullptr;
    int n_head = 0, r_kv = 0, d_r = 0;  // planned for: a call has exactly these
    int row_blocks = 1;                 // 16-head row blocks per block (1 or 2)
    int key_tile = 64;
    int head_tiles = 0;  // blocks per query
    int ld_lat = 0;      // row stride (elements) of the bf16 query and key tiles
    int ld_score = 0;    // of the fp32 score tile
    int ld_prob = 0;     // of the bf16 probability tile
    int q_off = 0;       // [16·row_blocks, r_kv + d_r] bf16 q̂
    int k_off = 0;       // [key_tile, r_kv + d_r] bf16 gathered latent rows
    int score_off = 0;   // [16·row_blocks, key_tile] fp32 τ·scores
    int prob_off = 0;    // [16·row_blocks, key_tile] bf16 e^{s − m}
    int stat_off = 0;    // [3, 16·row_blocks] fp32 running max, sum, rescale
    int key_off = 0;     // [key_tile] int32 gathered key (−1: none)
    int smem_bytes = 0;
};
MlaSparsePlan mla_sparse_plan(int n_head, int r_kv, int d_r);

struct MlaSparseParams {
    int n_q = 0;
    int n_head = 0;                     // H
    int r_kv = 0;                       // latent width
    int d_r = 0;                        // rope key width (r_kv + d_r a multiple of 16)
    float tau = 1.0f;                   // softmax scale
    const float* q_hat = nullptr;       // [n_q, H, r_kv + d_r]
    PagedRows cache;                    // latent rows [c_kv | k_r | ...]
    const int32_t* seq = nullptr;       // [n_q] block-table row of each query, or null: 0
    const int32_t* visible = nullptr;   // [n_q] keys each query may see
    const int32_t* selected = nullptr;  // [n_q, n_selected] keys (−1: none)
    int n_selected = 0;
    float* o_bar = nullptr;  // [n_q, H, r_kv]
};

// ---- MoE -------------------------------------------------------------------------------------

constexpr int kMoeRankTile = 256;  // assignments per block of the dispatch plan
constexpr int kMoeTileRows = 128;  // grouped-GEMM rows per block (one expert's rows)

// The router's selection on given logits, model::route's rules (spec §6): s = σ(logits) or
// softmax; s' = s + bias picks (group-limited: groups scored by their top-2 s', or best s without
// a bias; topk_group kept, the others' choice scores set to group_fill); the top_k (ties to the
// smaller expert) take weights from s (or s'), renormalised w = u / (Σu + eps), times ρ.
// Dropless. One warp per token.
struct MoeRouteParams {
    int n_tok = 0;
    int n_exp = 0;  // E ≤ 1024
    int top_k = 0;
    int n_group = 1;
    int topk_group = 1;
    bool softmax = false;
    bool renormalize = true;
    float renorm_eps = 0.0f;
    float scale = 1.0f;  // ρ
    bool weights_from_biased = false;
    float group_fill = -std::numeric_limits<float>::infinity();
    const float* logits = nullptr;  // [n_tok, E]
    const float* bias = nullptr;    // [E] or null
    int32_t* idx = nullptr;         // [n_tok, top_k] best first
    float* weight = nullptr;        // [n_tok, top_k]
};

// The grouped experts' plan: grid bounds that hold for any routing of n_assign assignments (so
// nothing waits for the device's counts) and the dispatch scratch.
struct MoePlan {
    bool supported = false;
    const char* why = nullptr;
    int64_t n_assign = 0;   // n_tok·top_k
    int rank_tiles = 0;     // blocks of the dispatch plan
    int64_t row_tiles = 0;  // grouped-GEMM row tiles bound: ⌈n_assign / 128⌉ + min(E, n_assign)
    int up_col_tiles = 0;   // inter / 64
    int down_col_tiles = 0;  // d / 128
    int64_t scratch_bytes = 0;
};
MoePlan moe_plan(int64_t n_tok, int top_k, int n_exp, int d, int inter);

// The dispatch plan on the device (model/moe.cpp plan_dispatch): expert e owns grouped rows
// [offset[e], offset[e + 1]), its assignments in token order; GEMM row tiles
// [tile_start[e], tile_start[e + 1]) of kMoeTileRows rows. Arrays carved from the plan's scratch.
struct MoeDispatch {
    int n_tok = 0;
    int top_k = 0;
    int n_exp = 0;
    int32_t* tile_counts = nullptr;  // [rank_tiles, E] per-block counts, then first rows
    int32_t* offset = nullptr;       // [E + 1]
    int32_t* tile_start = nullptr;   // [E + 1]
    int32_t* row_of = nullptr;       // [n_tok·top_k] grouped row of each assignment (−1: none)
    int32_t* token_of = nullptr;     // [n_tok·top_k] token of each grouped row
};
MoeDispatch moe_dispatch_arrays(
    const MoePlan& plan, int n_tok, int top_k, int n_exp, void* scratch);

// The routed experts in two grouped launches (all experts each): h = SiLU(x W1ᵀ) ⊙ (x W3ᵀ) with
// x's rows gathered through token_of (no permuted copy), then out = h W2ᵀ; bf16 operands,
// fp32 accumulation, bf16 results.
struct MoeExpertParams {
    int d = 0;                 // hidden width (a multiple of 128)
    int inter = 0;             // I (a multiple of 64)
    const void* x = nullptr;   // [n_tok, d] bf16
    const void* w1 = nullptr;  // [E, I, d] bf16 gate
    const void* w3 = nullptr;  // [E, I, d] bf16 up
    const void* w2 = nullptr;  // [E, d, I] bf16 down
    void* h = nullptr;         // [n_assign, I] bf16
    void* out = nullptr;       // [n_assign, d] bf16
};

// ---- the calls (CUDA builds) -------------------------------------------------------------------

// Chunked prefill of every sequence (grid: V / bv value blocks × H × B, each running its
// sequence's chunks in order with the state on chip). Sequences of any length, 0 included.
void kda_chunk_prefill(const Stream& s, const KdaBatchParams& p);
// One decode token of each of B sequences, every head, one launch; the state is read and
// written once.
void kda_decode_step(const Stream& s, const KdaBatchParams& p);

void indexer_topk(const Stream& s, const IndexerTopkParams& p, const IndexerPlan& plan);
void mla_sparse(const Stream& s, const MlaSparseParams& p, const MlaSparsePlan& plan);

void moe_route(const Stream& s, const MoeRouteParams& p);
// From idx [n_tok, top_k] (int32, −1: dropped) of moe_route.
void moe_dispatch_plan(const Stream& s,
                       const MoePlan& plan,
                       const int32_t* idx,
                       const MoeDispatch& d);
void moe_experts(const Stream& s,
                 const MoePlan& plan,
                 const MoeDispatch& d,
                 const MoeExpertParams& p);
// y [n_tok, d] (f32 or bf16) = (accumulate ? y : 0) + Σ_{i<k} weight[t, i] · out[row_of[t, i]],
// in slot order, fp32 sums (the shared expert's output already in y is added to).
void moe_combine(const Stream& s,
                 const MoeDispatch& d,
                 const void* out,      // [n_assign, d] bf16
                 const float* weight,  // [n_tok, top_k]
                 int dim,
                 DType y_dtype,
                 void* y,
                 bool accumulate);

}  // namespace hymoe::backend::cuda
