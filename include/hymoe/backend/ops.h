// The op interface the model blocks call (spec/style.md §4). Every op works on row-major fp32
// tensors on the CPU (the readable reference), except that weight operands of the products may be
// bf16 or fp16 (gemm_w); shapes are checked once, here. Vector ops that act
// "per row" treat the last dimension as the row and every other dimension as rows.
// Conventions (spec/model-math.md §1): Linear weight W [out, in], y = x Wᵀ.
#pragma once

#include <cstdint>
#include <vector>

#include "hymoe/backend/ctx.h"
#include "hymoe/backend/kda_params.h"
#include "hymoe/tensor/tensor.h"

namespace hymoe::ops {

// ---- matrix products (hymoe's AVX-512 GEMM, BLAS) ---------------------------------------------

// y [n, out] = x [n, in] · w [out, in]ᵀ   (beta = 1: y += ...); w of any weight dtype (gemm_w)
void linear(const Tensor& x, const Tensor& w, Tensor& y, float beta = 0.0f);
// C [m, n] = alpha · op(A) · op(B) + beta · C, row-major, op = transpose when trans_*; lda, ldb,
// ldc are row strides. The one entry point every other fp32 product goes through: on a CPU with
// AVX-512F (unless the portable kernels are forced, set_weight_kernel) hymoe's own fp32 GEMM
// (backend/cpu/gemm_f32.h) for m ≥ 2 rows and n ≥ 16 columns, and for every product in
// batch-invariant runs; else OpenBLAS (sgemv for one row). docs/guide/performance.md has the
// measurements behind the split.
void gemm(bool trans_a,
          bool trans_b,
          int64_t m,
          int64_t n,
          int64_t k,
          float alpha,
          const float* a,
          int64_t lda,
          const float* b,
          int64_t ldb,
          float beta,
          float* c,
          int64_t ldc);

// ---- products with weights (backend/cpu/weight_gemm.cpp) ------------------------------------
// Weights are held at their storage dtype (model/weights.h): fp32, bf16 or fp16. Every product
// with a weight goes through gemm_w, which dispatches on it; activations and results stay fp32.
//   f32:  an AVX-512 GEMV streaming the weight for m ≤ 4 rows of a W [n, k] (decode), else
//         exactly ops::gemm.
//   bf16: the activations rounded to bf16 once per call, AVX-512-BF16 dot products (VDPBF16PS)
//         with fp32 accumulation: a few rows (m ≤ 4, decode) stream the weight once, more rows
//         (prefill) run a GEMM on packed weight panels. The portable path (CPUs without
//         avx512_bf16, fp16 weights, and dx = dy·W) widens the weight to fp32 and calls sgemm
//         (activations exact). docs/guide/precision.md has the bounds and measurements.

// A weight operand: row-major data at its storage dtype.
struct WeightRef {
    const void* data = nullptr;
    DType dtype = DType::f32;
    WeightRef at(int64_t offset) const;  // the same weight `offset` elements further on
};
WeightRef weight_ref(const Tensor& w);

// C [m, n] = alpha · A [m, k] · op(W) + beta · C (row-major; lda, ldw, ldc row strides), with
// op(W) = Wᵀ for W [n, k] when trans_w (y = x Wᵀ), else W [k, n] (dx = dy W, backward).
void gemm_w(bool trans_w,
            int64_t m,
            int64_t n,
            int64_t k,
            float alpha,
            const float* a,
            int64_t lda,
            WeightRef w,
            int64_t ldw,
            float beta,
            float* c,
            int64_t ldc);

// Which kernels run the products: picked once from cpuid (automatic), or forced (tests,
// benchmarks); forcing a kernel the CPU lacks fails.
//   avx512_bf16: hymoe's AVX-512 fp32 GEMM and GEMV, and the AVX-512-BF16 bf16 weight kernels;
//   avx512:      hymoe's AVX-512 fp32 GEMM and GEMV, 16-bit weights widened to fp32 (portable);
//   portable:    OpenBLAS for every fp32 product, 16-bit weights widened to fp32.
enum class WeightKernel { automatic, avx512_bf16, avx512, portable };
void set_weight_kernel(WeightKernel k);
WeightKernel weight_kernel();  // the one in use (automatic resolved)
const char* to_string(WeightKernel k);

// Running totals over every ops::gemm call of the process, always on (one clock read on each side
// of the BLAS call): flops += 2·m·n·k, seconds += the call's wall time. Benchmarks read the
// difference around the code they measure. Process-global and not thread-safe: gemm calls from
// several threads at once would race on it (the model calls gemm from one thread).
// Batch-invariant products (inference.batch_invariant): OpenBLAS rounds a row of sgemm differently
// with the number of rows in the call (and one row goes to sgemv), so a sequence's logits would
// depend on what shares its batch. When on, gemm sends every product to hymoe's AVX-512 GEMM,
// whose rows do not depend on each other; with the portable kernels it computes a non-transposed A
// in calls of exactly 8 rows (the tail padded with zero rows), so every row goes through the same
// kernel whatever its neighbours. Either way results are bit-identical across batchings (the
// portable way costs prefill speed: B is packed once per 8 rows). Process-global, set once
// before a run.
void set_batch_invariant(bool on);

struct GemmCounter {
    double flops = 0;
    double seconds = 0;
};
GemmCounter& gemm_counter();

// ---- normalisation ---------------------------------------------------------------------------

// y = w ⊙ x · (mean(x²) + eps)^{-1/2} per row; w [dim]. y may alias x.
void rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor& y);
// y = (x − mean) / sqrt(var + eps) ⊙ w + b per row; w, b [dim]. y may alias x.
void layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, float eps, Tensor& y);
// x ← x · (Σx² + eps)^{-1/2} over each row of `dim` floats (fla l2norm: eps inside the sum).
void l2_norm_rows(float* x, int64_t rows, int64_t dim, float eps = 1e-6f);

// ---- elementwise -----------------------------------------------------------------------------

float sigmoid(float x);
float silu(float x);      // x σ(x)
float softplus(float x);  // log(1 + eˣ), identity above 20 (torch threshold)
void silu_inplace(Tensor& x);
void sigmoid_inplace(Tensor& x);
// y [n, f] = SiLU(gate [n, f]) ⊙ up [n, f]; y may alias gate.
void swiglu(const Tensor& gate, const Tensor& up, Tensor& y);
// x ← x + y
void add_inplace(Tensor& x, const Tensor& y);
// x ← ReLU(x)² (relu2 experts)
void relu2_inplace(Tensor& x);

// softmax over each row of n floats, in place; −inf entries get probability 0.
void softmax_rows(float* x, int64_t rows, int64_t n);

// ---- positions -------------------------------------------------------------------------------

// RoPE frequencies θ_i, i < rot_dim/2 (θ_i = base^{−2i/rot_dim}), optionally YaRN-corrected
// (spec §4: θ'_i = θ_i/factor·(1−smooth) + θ_i·smooth over the correction range).
struct RopeFreqs {
    std::vector<float> theta;  // [rot_dim / 2]
    float mscale = 1.0f;       // cos/sin multiplier (YaRN attention scaling; 1 without YaRN)
};
RopeFreqs rope_freqs(int rot_dim, double base);
RopeFreqs rope_freqs_yarn(int rot_dim,
                          double base,
                          double factor,
                          int64_t original_max_pos,
                          double beta_fast,
                          double beta_slow,
                          double mscale = 1.0);

// Rotate `rot_dim` dims of every head vector, token t at position pos[t]. x points at the first
// rotated element of head 0 of token 0; heads are head_stride floats apart, tokens token_stride.
// interleaved: pairs (x_2i, x_2i+1) (DeepSeek MLA); otherwise rotate-half pairs (x_i, x_i+d/2)
// (DeepSeek indexer, HF default).
void rope(float* x,
          int64_t n_tok,
          int64_t n_head,
          int64_t token_stride,
          int64_t head_stride,
          const int64_t* pos,
          const RopeFreqs& freqs,
          bool interleaved);

// ---- selection -------------------------------------------------------------------------------

// The indices of the k largest of x[0..n), best first; ties go to the smaller index. k ≤ n.
void top_k(const float* x, int64_t n, int64_t k, int64_t* idx);

// ---- the DSA indexer in bf16 (backend/cpu/indexer_ops.cpp) -----------------------------------
// The lightning indexer's scores with bf16 operands, as DeepSeek-V3.2 runs them in FP8:
//   I(t, s) = Σ_j w_t,j · ReLU(bf16(q_t,j) · bf16(k_s)), products and sums in fp32,
// keys packed once per call in tiles of 16 (dims in pairs, the VDPBF16PS operand order), queries
// rounded to bf16 (nearest even) inside. AVX-512-BF16 kernel when set_weight_kernel resolves to
// avx512_bf16, else a portable loop with the same pair order. Bound against fp32 scores:
// docs/guide/precision.md.

// Keys [n, d] in tiles of 16: tile T, pair p holds keys 16T..16T+15 × dims (2p, 2p+1), 32 bf16
// (zeros past n and past d).
class IndexerKeys {
public:
    IndexerKeys(int64_t n, int64_t d);
    int64_t n() const { return n_; }
    int64_t d() const { return d_; }
    void put(int64_t i, const uint16_t* k);  // key i [d] from bf16
    void put(int64_t i, const float* k);     // key i [d] rounded to bf16
    const uint16_t* tile(int64_t t) const { return data_.data() + t * pairs() * 32; }
    int64_t pairs() const { return (d_ + 1) / 2; }

private:
    int64_t n_, d_;
    std::vector<uint16_t> data_;  // [⌈n/16⌉, pairs, 16, 2]
};

// scores [n_q, n_k] (row stride ld_s) = Σ_j w [n_q, n_head]_t,j · ReLU(q_t,j · k_s) over the first
// n_k ≤ k.n() keys; q [n_q, n_head · k.d()] fp32.
void indexer_scores_bf16(const float* q,
                         const float* w,
                         int64_t n_q,
                         int64_t n_head,
                         const IndexerKeys& k,
                         int64_t n_k,
                         float* scores,
                         int64_t ld_s);

// ---- causal depthwise conv -------------------------------------------------------------------

// Causal depthwise conv over time for one sequence, with a tail of the previous W−1 inputs:
//   y_t[c] = Σ_{i<W} w[c, i] · u_{t−W+1+i}[c],  u_{<0} from tail (zeros for a new sequence).
// u, y [T, C] (y may not alias u); w [C, W]; tail [W−1, C] is read, then replaced by the last
// W−1 inputs (so chunked prefill and decode continue the same sequence).
void causal_conv(const Tensor& u, const Tensor& w, Tensor& tail, Tensor& y);

// ---- ops on a Ctx (backend/ctx.h) -------------------------------------------------------------
// The backend-neutral ops the model blocks call: the ops above on the tensors of ctx's device.
// src/backend/ops.cpp is the only switch on the device. CPU: exactly the functions above, bit for
// bit. CUDA: the kernels of backend/cuda_ops.h and cuda_model_ops.h and the products of
// cuda_gemm.h, with the same semantics (tests/cuda compares each against the CPU); a product's x
// and w share f32 or bf16 (fp32 accumulation), or an f32 x is rounded to w's bf16 once per call (as
// gemm_w). Every tensor must be on ctx.device (checked here, once).
using backend::Ctx;

void linear(const Ctx& ctx, const Tensor& x, const Tensor& w, Tensor& y, float beta = 0.0f);
void rms_norm(const Ctx& ctx, const Tensor& x, const Tensor& w, float eps, Tensor& y);
void silu_inplace(const Ctx& ctx, Tensor& x);
void sigmoid_inplace(const Ctx& ctx, Tensor& x);
void relu2_inplace(const Ctx& ctx, Tensor& x);
void swiglu(const Ctx& ctx, const Tensor& gate, const Tensor& up, Tensor& y);
void add_inplace(const Ctx& ctx, Tensor& x, const Tensor& y);
// softmax over each row of x (its last dimension), in place.
void softmax_rows(const Ctx& ctx, Tensor& x);
// causal_conv for one sequence (u, y [T, C], w [C, W], tail [W−1, C] read then replaced).
void causal_conv(const Ctx& ctx, const Tensor& u, const Tensor& w, Tensor& tail, Tensor& y);
// idx [rows, k] int64 = top_k of every row of x [rows, n] f32 (best first, ties to the smaller
// index).
void top_k_rows(const Ctx& ctx, const Tensor& x, int64_t k, Tensor& idx);

// ---- KDA recurrence (backend/kda_params.h; backend/cpu/kda_scan.cpp, kda_chunk_backward.cpp) ----
// One sequence, every head, fp32 (spec/model-math.md §3); each continues from p.S and leaves there
// the state after the last token. The CPU forms first, then the same ops on a Ctx: CPU, exactly
// these; CUDA, kda_recurrent and kda_chunked run cuda::kda_recurrent (backend/cuda_ops.h, device
// pointers), the checkpoints chunk by chunk with it; the backward cuda_kda_backward.h.

// The naive recurrence, token by token (fla naive_recurrent_kda).
void kda_recurrent(const KdaScanParams& p);
// The chunked WY form (fla naive_chunk_kda): the same result, in chunks of `chunk` tokens.
void kda_chunked(const KdaScanParams& p, int chunk = 64);
// kda_chunked that also keeps the state before every chunk: ckpt [⌈T/chunk⌉, H, K, V], the
// checkpoints kda_scan_backward starts each chunk's recompute from.
void kda_chunked_checkpoints(const KdaScanParams& p, float* ckpt, int chunk = 64);
// The recurrence's backward for one sequence, chunked: a reverse sweep over the chunks that
// recomputes each chunk's WY matrices from its checkpoint (kda_chunked_checkpoints with the same p
// and chunk) and takes the chunk's gradients as GEMMs per head
// (backend/cpu/kda_chunk_backward.cpp), carrying ∂L/∂S across the chunk boundaries (∂L/∂S = 0 after
// the last token). Reads q, k, v, g, beta of p; p.S and p.o are not used.
void kda_scan_backward(const KdaScanParams& p,
                       const float* ckpt,  // [⌈T/chunk⌉, H, K, V]
                       const KdaScanGrads& d,
                       int chunk = 64);
// The same gradients token by token (backend/cpu/kda_scan_backward.cpp): each chunk's per-token
// states recomputed from its checkpoint, then a reverse sweep over its tokens; the reference the
// chunked backward is tested and benchmarked against.
void kda_scan_backward_tokens(const KdaScanParams& p,
                              const float* ckpt,
                              const KdaScanGrads& d,
                              int chunk = 64);

void kda_recurrent(const Ctx& ctx, const KdaScanParams& p);
void kda_chunked(const Ctx& ctx, const KdaScanParams& p, int chunk = 64);
void kda_chunked_checkpoints(const Ctx& ctx, const KdaScanParams& p, float* ckpt, int chunk = 64);
void kda_scan_backward(const Ctx& ctx,
                       const KdaScanParams& p,
                       const float* ckpt,
                       const KdaScanGrads& d,
                       int chunk = 64);

}  // namespace hymoe::ops
