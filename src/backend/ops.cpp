// The ops on a Ctx (hymoe/backend/ops.h, backend/ctx.h): the only switch on the device, with its
// continuations by job (ops_train.cpp, ops_moe.cpp, ops_vision.cpp; ops_switch.h). Each op
// checks that its tensors are on ctx's device, then runs the CPU op (backend/cpu/) or queues the
// CUDA kernel (backend/cuda/, CUDA builds) of the same name and semantics. The CUDA headers are
// plain C++; in a CPU build the CUDA branches are discarded (if constexpr) and never linked.
#include "hymoe/backend/ops.h"

#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <utility>
#include <vector>

#include "hymoe/backend/cuda_fused.h"
#include "hymoe/backend/cuda_gemm.h"
#include "hymoe/backend/cuda_kda_batch.h"
#include "hymoe/backend/cuda_model_ops.h"
#include "hymoe/backend/cuda_ops.h"
#include "hymoe/backend/kda_batch.h"
#include "hymoe/backend/ops_attention.h"
#include "hymoe/backend/ops_kda.h"
#include "hymoe/backend/ops_lora.h"
#include "hymoe/backend/ops_mla.h"
#include "hymoe/backend/scratch_stand_in.h"
#include "hymoe/core/error.h"
#include "ops_switch.h"

namespace hymoe {

using namespace backend::detail;

namespace backend {

// On CUDA, from the thread's stand-in for the arena when one is installed (a captured step's
// fixed-address workspace, backend/scratch_stand_in.h), else from the arena.
Scratch::~Scratch() {
    if constexpr (kCudaBuild) {
        ScratchStandIn* w = ScratchStandIn::active(ctx_.arena);
        for (auto p = device_.rbegin(); p != device_.rend(); ++p)
            if (w != nullptr)
                w->release(*p);
            else
                ctx_.arena->free(*p);
    }
}

Tensor Scratch::operator()(DType dtype, Shape shape) {
    if constexpr (kCudaBuild)
        if (ctx_.device == Device::cuda) {
            ScratchStandIn* w = ScratchStandIn::active(ctx_.arena);
            Tensor t = w ? w->tensor(dtype, std::move(shape))
                         : ctx_.arena->tensor(dtype, std::move(shape));
            device_.push_back(t.data);
            return t;
        }
    return host_.emplace_back(dtype, std::move(shape)).view();
}

}  // namespace backend

namespace ops {

// On CUDA an f32 x of a bf16 w goes through a bf16 copy (the CPU's gemm_w rounds it the same way).
void linear(const Ctx& ctx, const Tensor& x, const Tensor& w, Tensor& y, float beta) {
    check_on(ctx, "linear", {&x, &w, &y});
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda) {
            if (x.dtype == DType::f32 && w.dtype == DType::bf16) {
                backend::Scratch scratch(ctx);
                Tensor xc = scratch(DType::bf16, x.shape);
                cu::cast(*ctx.stream, x, xc);
                return ctx.blas->linear(xc, w, y, beta);
            }
            return ctx.blas->linear(x, w, y, beta);
        }
    linear(x, w, y, beta);
}

void rms_norm(const Ctx& ctx, const Tensor& x, const Tensor& w, float eps, Tensor& y) {
    check_on(ctx, "rms_norm", {&x, &w, &y});
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda)
            return cu::rms_norm(*ctx.stream, x, w, eps, y);
    rms_norm(x, w, eps, y);
}

void silu_inplace(const Ctx& ctx, Tensor& x) {
    check_on(ctx, "silu_inplace", {&x});
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda)
            return cu::silu_inplace(*ctx.stream, x);
    silu_inplace(x);
}

void sigmoid_inplace(const Ctx& ctx, Tensor& x) {
    check_on(ctx, "sigmoid_inplace", {&x});
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda)
            return cu::sigmoid_inplace(*ctx.stream, x);
    sigmoid_inplace(x);
}

void relu2_inplace(const Ctx& ctx, Tensor& x) {
    check_on(ctx, "relu2_inplace", {&x});
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda)
            return cu::relu2_inplace(*ctx.stream, x);
    relu2_inplace(x);
}

void swiglu(const Ctx& ctx, const Tensor& gate, const Tensor& up, Tensor& y) {
    check_on(ctx, "swiglu", {&gate, &up, &y});
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda)
            return cu::swiglu(*ctx.stream, gate, up, y);
    swiglu(gate, up, y);
}

void add_inplace(const Ctx& ctx, Tensor& x, const Tensor& y) {
    check_on(ctx, "add_inplace", {&x, &y});
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda)
            return cu::add_inplace(*ctx.stream, x, y);
    add_inplace(x, y);
}

void softmax_rows(const Ctx& ctx, Tensor& x) {
    check_on(ctx, "softmax_rows", {&x});
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda)
            return cu::softmax_rows(*ctx.stream, x);
    const int64_t n = x.dim(-1);
    softmax_rows(x.ptr<float>(), n > 0 ? x.numel() / n : 0, n);
}

void causal_conv(const Ctx& ctx, const Tensor& u, const Tensor& w, Tensor& tail, Tensor& y) {
    check_on(ctx, "causal_conv", {&u, &w, &tail, &y});
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda)
            return cu::causal_conv(*ctx.stream, u, w, tail, y);
    causal_conv(u, w, tail, y);
}

void top_k_rows(const Ctx& ctx, const Tensor& x, int64_t k, Tensor& idx) {
    check_on(ctx, "top_k_rows", {&x, &idx});
    const int64_t n = x.dim(-1), rows = x.numel() / std::max<int64_t>(n, 1);
    HYMOE_CHECK(
        x.dtype == DType::f32 && idx.dtype == DType::i64 && idx.numel() == rows * k && k <= n,
        "top_k_rows: idx ",
        shape_string(idx.shape),
        " (",
        to_string(idx.dtype),
        ") for the top ",
        k,
        " of ",
        shape_string(x.shape));
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda)
            return cu::top_k_rows(*ctx.stream, x, k, idx);
    for (int64_t r = 0; r < rows; ++r)
        top_k(x.ptr<float>() + r * n, n, k, idx.ptr<int64_t>() + r * k);
}

// ---- the KDA block's elementwise ops (backend/ops_kda.h) --------------------------------------

void kda_decay_gate(const Ctx& ctx,
                    Tensor& g,
                    const Tensor& a_log,
                    const Tensor& dt_bias,
                    std::optional<float> lower_bound) {
    check_on(ctx, "kda_decay_gate", {&g, &a_log, &dt_bias});
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda)
            return cu::kda_decay_gate(*ctx.stream,
                                      g,
                                      a_log,
                                      dt_bias,
                                      lower_bound.has_value(),
                                      lower_bound.value_or(0.0f));
    kda_decay_gate(g, a_log, dt_bias, lower_bound);
}

void l2_norm_rows(const Ctx& ctx, Tensor& x, float eps) {
    check_on(ctx, "l2_norm_rows", {&x});
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda)
            return cu::l2_norm_rows(*ctx.stream, x, eps);
    HYMOE_CHECK(x.dtype == DType::f32, "l2_norm_rows: a ", to_string(x.dtype), " tensor");
    const int64_t dim = x.dim(-1);
    l2_norm_rows(x.ptr<float>(), dim > 0 ? x.numel() / dim : 0, dim, eps);
}

void scale_inplace(const Ctx& ctx, Tensor& x, float c) {
    check_on(ctx, "scale_inplace", {&x});
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda)
            return cu::scale_inplace(*ctx.stream, x, c);
    scale_inplace(x, c);
}

void mul_inplace(const Ctx& ctx, Tensor& x, const Tensor& y) {
    check_on(ctx, "mul_inplace", {&x, &y});
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda)
            return cu::mul_inplace(*ctx.stream, x, y);
    mul_inplace(x, y);
}

// ---- the MLA/DSA block's ops (backend/ops_attention.h) ------------------------------------------

void rope(const Ctx& ctx,
          Tensor& x,
          int64_t col0,
          int64_t n_head,
          int64_t head_stride,
          const Tensor& pos,
          const RopeFreqs& freqs,
          bool interleaved) {
    check_on(ctx, "rope", {&x, &pos});
    HYMOE_CHECK(x.shape.size() == 2, "rope: x ", shape_string(x.shape), ", not [n_tok, width]");
    const int64_t n_tok = x.dim(0), width = x.dim(1);
    const auto rot = static_cast<int64_t>(2 * freqs.theta.size());
    HYMOE_CHECK(x.dtype == DType::f32 && pos.dtype == DType::i64 && pos.numel() == n_tok &&
                    n_head > 0 && col0 + (n_head - 1) * head_stride + rot <= width,
                "rope: x ",
                shape_string(x.shape),
                " (",
                to_string(x.dtype),
                "), ",
                pos.numel(),
                " positions, ",
                n_head,
                " heads of ",
                rot,
                " rotated dims from column ",
                col0,
                " every ",
                head_stride);
    float* first = x.ptr<float>() + col0;
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda)
            return cu::rope(*ctx.stream,
                            DType::f32,
                            first,
                            n_tok,
                            n_head,
                            width,
                            head_stride,
                            pos.ptr<int64_t>(),
                            freqs,
                            interleaved);
    rope(first, n_tok, n_head, width, head_stride, pos.ptr<int64_t>(), freqs, interleaved);
}

void copy_cols(const Ctx& ctx, const Tensor& src, int64_t col0, Tensor& dst) {
    check_on(ctx, "copy_cols", {&src, &dst});
    HYMOE_CHECK(src.shape.size() == 2 && !dst.shape.empty(),
                "copy_cols: src ",
                shape_string(src.shape),
                " dst ",
                shape_string(dst.shape));
    const int64_t n = src.dim(0), width = src.dim(1), w = dst.dim(-1);
    HYMOE_CHECK(dst.numel() == n * w && src.dtype == dst.dtype && col0 >= 0 && col0 + w <= width,
                "copy_cols: columns [",
                col0,
                ", ",
                col0 + w,
                ") of ",
                shape_string(src.shape),
                " into ",
                shape_string(dst.shape));
    const size_t es = dtype_size(src.dtype);
    const auto* from = static_cast<const unsigned char*>(src.data) + col0 * es;
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda)
            return cu::copy_2d(*ctx.stream, src.dtype, from, width, dst.data, w, n, w);
    auto* to = static_cast<unsigned char*>(dst.data);
    for (int64_t r = 0; r < n; ++r)
        std::memcpy(to + r * w * es, from + r * width * es, w * es);
}

void layer_norm(
    const Ctx& ctx, const Tensor& x, const Tensor& w, const Tensor& b, float eps, Tensor& y) {
    check_on(ctx, "layer_norm", {&x, &w, &b, &y});
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda)
            return cu::layer_norm(*ctx.stream, x, w, b, eps, y);
    layer_norm(x, w, b, eps, y);
}

void upload(const Ctx& ctx, const Tensor& src, Tensor& dst) {
    check_on(ctx, "upload", {&dst});
    HYMOE_CHECK(src.device == Device::cpu && src.dtype == dst.dtype && src.numel() == dst.numel(),
                "upload: a ",
                to_string(src.device),
                " ",
                to_string(src.dtype),
                " tensor of ",
                shape_string(src.shape),
                " into a ",
                to_string(dst.dtype),
                " one of ",
                shape_string(dst.shape));
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda)
            return cu::upload(src, dst, *ctx.stream);
    if (src.numel() > 0)
        std::memcpy(dst.data, src.data, src.numel() * dtype_size(src.dtype));
}

void attention_core(const Ctx& ctx,
                    const Tensor& q,
                    const Tensor& k,
                    const Tensor& v,
                    const Tensor& mask,
                    float tau,
                    Tensor& o) {
    check_on(ctx, "attention_core", {&q, &k, &v, &mask, &o});
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda) {
            backend::Scratch scratch(ctx);
            Tensor scores = scratch(DType::f32, mask.shape);
            return cu::attention_core(*ctx.blas, q, k, v, mask, tau, scores, o);
        }
    attention_core(q, k, v, mask, tau, o);
}

void indexer_scores(
    const Ctx& ctx, const Tensor& q, const Tensor& w, const Tensor& k, Tensor& scores) {
    check_on(ctx, "indexer_scores", {&q, &w, &k, &scores});
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda)
            return cu::indexer_scores(*ctx.stream, q, w, k, scores);
    indexer_scores(q, w, k, scores);
}

// CUDA: the kernel also lists the kept keys, into scratch here.
void indexer_mask(
    const Ctx& ctx, const Tensor& scores, int64_t pos_first, int64_t index_topk, Tensor& mask) {
    check_on(ctx, "indexer_mask", {&scores, &mask});
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda) {
            backend::Scratch scratch(ctx);
            Tensor kept = scratch(DType::i64, {scores.dim(0), std::min(index_topk, scores.dim(1))});
            return cu::indexer_mask(*ctx.stream, scores, pos_first, index_topk, kept, mask);
        }
    indexer_mask(scores, pos_first, index_topk, mask);
}

// ---- MLA over the latent cache: views and params, so only the tensors given are checked -------

void latent_append(const Ctx& ctx,
                   const LatentCache& cache,
                   const Tensor& row_seq,
                   const Tensor& pos,
                   const Tensor& c_kv,
                   const Tensor& k_r,
                   const Tensor& k_idx) {
    check_on(ctx, "latent_append", {&row_seq, &pos, &c_kv, &k_r, &k_idx});
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda)
            return cu::latent_append(ctx, cache, row_seq, pos, c_kv, k_r, k_idx);
    latent_append(cache, row_seq.ptr<int32_t>(), pos.ptr<int64_t>(), c_kv, k_r, k_idx);
}

void mla_attend(const Ctx& ctx, const MlaAttendParams& p) {
    check_on(ctx, "mla_attend", {&p.q, &p.kv_b, &p.q_idx, &p.w_idx, &p.o});
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda)
            return cu::mla_attend(ctx, p);
    if (p.rows == nullptr)
        return mla_attend(p);
    // a device step's rows (one cache, block-table row s = sequence s) on the CPU: each
    // sequence's view starts at its row; the decode rows and fused plans are the GPU's
    HYMOE_CHECK(p.caches != nullptr && p.caches[0].paged(),
                "mla_attend: device rows without their paged cache");
    std::vector<LatentCache> views(static_cast<size_t>(p.n_seq), p.caches[0]);
    for (int64_t s = 0; s < p.n_seq; ++s)
        views[s].block_table = p.caches[0].block_table + s * p.caches[0].max_pages;
    MlaAttendParams per_sequence = p;
    per_sequence.caches = views.data();
    per_sequence.rows = nullptr;
    mla_attend(per_sequence);
}

// ---- KDA recurrence: pointers in KdaScanParams, so only the context is checked ----------------

void kda_recurrent(const Ctx& ctx, const KdaScanParams& p) {
    check_on(ctx, "kda_recurrent", {});
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda)
            return cu::kda_recurrent(*ctx.stream, p);
    kda_recurrent(p);
}

// The chunked form is an evaluation order of the same recurrence: on CUDA the one-sequence
// recurrent kernel computes it (fp32, within the tolerance of tests/cuda).
void kda_chunked(const Ctx& ctx, const KdaScanParams& p, int chunk) {
    check_on(ctx, "kda_chunked", {});
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda)
            return cu::kda_recurrent(*ctx.stream, p);
    kda_chunked(p, chunk);
}

// ---- KDA over a packed batch (backend/kda_batch.h): the table's pointers are ctx's -----------

void kda_conv_silu(const Ctx& ctx,
                   const KdaSeqTable& t,
                   const Tensor& u,
                   const Tensor& w,
                   int plane,
                   Tensor& out) {
    check_on(ctx, "kda_conv_silu", {&u, &w, &out});
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda)
            return cu::kda_conv_silu(*ctx.stream, t, u, w, plane, out);
    kda_conv_silu(t, u, w, plane, out);
}

void kda_scan_batch(const Ctx& ctx, const KdaSeqTable& t, const KdaBatchScan& p) {
    check_on(ctx, "kda_scan_batch", {});
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda)
            return cu::kda_scan_batch(*ctx.stream, t, p);
    kda_scan_batch(t, p);
}

// ---- LoRA on row lists (backend/ops_lora.h) -----------------------------------------------------

void lora_rows_add(const Ctx& ctx,
                   const Tensor& rows,
                   const Tensor& A,
                   const Tensor& B,
                   float scale,
                   const Tensor& x,
                   Tensor& y) {
    check_on(ctx, "lora_rows_add", {&rows, &A, &B, &x, &y});
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda) {
            const int64_t m = rows.numel(), r = A.dim(0), out = B.dim(0);
            HYMOE_CHECK(y.dim(1) == out && B.dim(1) == r && x.dim(1) == A.dim(1),
                        "lora_rows_add: x ",
                        shape_string(x.shape),
                        ", y ",
                        shape_string(y.shape),
                        ", A ",
                        shape_string(A.shape),
                        ", B ",
                        shape_string(B.shape));
            if (m == 0)
                return;
            backend::Scratch scratch(ctx);
            // the rows in fp32 whatever x's and y's dtypes (f32 or bf16; y rounded back once)
            auto f32_rows = [&](const Tensor& src, Tensor& raw) {
                raw = scratch(src.dtype, {m, src.dim(1)});
                cu::gather_rows(*ctx.stream, src, rows, raw);
                if (src.dtype == DType::f32)
                    return raw;
                Tensor f = scratch(DType::f32, {m, src.dim(1)});
                cu::cast(*ctx.stream, raw, f);
                return f;
            };
            Tensor xr, yr;
            const Tensor xg = f32_rows(x, xr);       // [m, in] the rows of x
            Tensor t = scratch(DType::f32, {m, r});  // [m, r] = x Aᵀ
            ctx.blas->linear(xg, A, t);
            Tensor yg = f32_rows(y, yr);  // [m, out] the rows of y
            ctx.blas->gemm(DType::f32,    // yg += scale · t Bᵀ
                           DType::f32,
                           false,
                           true,
                           m,
                           out,
                           r,
                           scale,
                           t.data,
                           r,
                           B.data,
                           r,
                           1.0f,
                           yg.data,
                           out);
            if (yr.data != yg.data)
                cu::cast(*ctx.stream, yg, yr);
            return cu::scatter_rows(*ctx.stream, yr, rows, y);
        }
    lora_rows_add(rows, A, B, scale, x, y);
}

// On CUDA the five products of the CPU form through cuBLAS, fp32.
void lora_pair_backward(const Ctx& ctx,
                        const Tensor& A,
                        const Tensor& B,
                        float scale,
                        const Tensor& x,
                        const Tensor& dy,
                        Tensor& dA,
                        Tensor& dB,
                        Tensor& dx,
                        float beta) {
    check_on(ctx, "lora_pair_backward", {&A, &B, &x, &dy, &dA, &dB, &dx});
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda) {
            const int64_t m = x.dim(0), r = A.dim(0), in = A.dim(1), out = B.dim(0);
            const bool train = dA.data != nullptr;
            HYMOE_CHECK(A.dtype == DType::f32 && B.dtype == DType::f32 && x.dtype == DType::f32 &&
                            dy.dtype == DType::f32 && dx.dtype == DType::f32 && x.dim(1) == in &&
                            B.dim(1) == r && dy.dim(0) == m && dy.dim(1) == out &&
                            dx.shape == x.shape &&
                            (!train || (dA.shape == A.shape && dB.shape == B.shape)),
                        "lora_pair_backward: x ",
                        shape_string(x.shape),
                        ", dy ",
                        shape_string(dy.shape),
                        ", A ",
                        shape_string(A.shape),
                        ", B ",
                        shape_string(B.shape));
            if (m == 0)
                return;
            const DType f = DType::f32;
            backend::Scratch scratch(ctx);
            Tensor t = scratch(f, {m, r});  // x Aᵀ
            ctx.blas->linear(x, A, t);
            Tensor g = scratch(f, {m, r});  // dy B
            ctx.blas->gemm(
                f, f, false, false, m, r, out, 1.0f, dy.data, out, B.data, r, 0.0f, g.data, r);
            if (train) {
                ctx.blas->gemm(
                    f, f, true, false, out, r, m, scale, dy.data, out, t.data, r, 1.0f, dB.data, r);
                ctx.blas->gemm(
                    f, f, true, false, r, in, m, scale, g.data, r, x.data, in, 1.0f, dA.data, in);
            }
            return ctx.blas->gemm(
                f, f, false, false, m, in, r, scale, g.data, r, A.data, in, beta, dx.data, in);
        }
    lora_pair_backward(A, B, scale, x, dy, dA, dB, dx, beta);
}

// On CUDA the rows of x, dy and dx gathered, the pair backward accumulating into dx's rows, and
// those rows scattered back.
void lora_rows_backward(const Ctx& ctx,
                        const Tensor& rows,
                        const Tensor& A,
                        const Tensor& B,
                        float scale,
                        const Tensor& x,
                        const Tensor& dy,
                        Tensor& dA,
                        Tensor& dB,
                        Tensor& dx) {
    check_on(ctx, "lora_rows_backward", {&rows, &A, &B, &x, &dy, &dA, &dB, &dx});
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda) {
            const int64_t m = rows.numel();
            HYMOE_CHECK(rows.dtype == DType::i64 && x.dtype == DType::f32 &&
                            dy.dtype == DType::f32 && dx.dtype == DType::f32 &&
                            dy.dim(0) == x.dim(0) && dx.shape == x.shape,
                        "lora_rows_backward: x ",
                        shape_string(x.shape),
                        ", dy ",
                        shape_string(dy.shape),
                        ", dx ",
                        shape_string(dx.shape));
            if (m == 0)
                return;
            backend::Scratch scratch(ctx);
            Tensor xg = scratch(DType::f32, {m, x.dim(1)});    // [m, in]
            Tensor dyg = scratch(DType::f32, {m, dy.dim(1)});  // [m, out]
            Tensor dxg = scratch(DType::f32, {m, dx.dim(1)});  // [m, in]
            cu::gather_rows(*ctx.stream, x, rows, xg);
            cu::gather_rows(*ctx.stream, dy, rows, dyg);
            cu::gather_rows(*ctx.stream, dx, rows, dxg);
            lora_pair_backward(ctx, A, B, scale, xg, dyg, dA, dB, dxg, 1.0f);
            return cu::scatter_rows(*ctx.stream, dxg, rows, dx);
        }
    lora_rows_backward(rows, A, B, scale, x, dy, dA, dB, dx);
}

}  // namespace ops

}  // namespace hymoe
