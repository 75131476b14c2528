// The ops on a Ctx (hymoe/backend/ops.h, backend/ctx.h): the only switch on the device. Each op
// checks that its tensors are on ctx's device, then runs the CPU op (backend/cpu/) or queues the
// CUDA kernel (backend/cuda/, CUDA builds) of the same name and semantics. The CUDA headers are
// plain C++; in a CPU build the CUDA branches are discarded (if constexpr) and never linked.
#include "hymoe/backend/ops.h"

#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <utility>
#include <vector>

#include "hymoe/backend/cuda_backward.h"
#include "hymoe/backend/cuda_fused.h"
#include "hymoe/backend/cuda_gemm.h"
#include "hymoe/backend/cuda_kda_backward.h"
#include "hymoe/backend/cuda_kda_batch.h"
#include "hymoe/backend/cuda_model_ops.h"
#include "hymoe/backend/cuda_ops.h"
#include "hymoe/backend/cuda_reduce.h"
#include "hymoe/backend/cuda_router_loss.h"
#include "hymoe/backend/kda_batch.h"
#include "hymoe/backend/moe_route.h"
#include "hymoe/backend/ops_attention.h"
#include "hymoe/backend/ops_backward.h"
#include "hymoe/backend/ops_kda.h"
#include "hymoe/backend/ops_kda_backward.h"
#include "hymoe/backend/ops_lora.h"
#include "hymoe/backend/ops_mla.h"
#include "hymoe/backend/ops_moe.h"
#include "hymoe/backend/ops_reduce.h"
#include "hymoe/backend/ops_router_loss.h"
#include "hymoe/backend/ops_rows.h"
#include "hymoe/backend/scratch_stand_in.h"
#include "hymoe/core/error.h"

namespace hymoe {

namespace {

#ifdef HYMOE_CUDA
constexpr bool kCudaBuild = true;
#else
constexpr bool kCudaBuild = false;
#endif

namespace cu = backend::cuda;

// Every tensor of a call on ctx's device; a CUDA context complete, and only in a CUDA build.
void check_on(const backend::Ctx& ctx, const char* op, std::initializer_list<const Tensor*> ts) {
    for (const Tensor* t : ts)
        HYMOE_CHECK(t->device == ctx.device || t->data == nullptr,
                    op,
                    ": a ",
                    to_string(t->device),
                    " tensor on a ",
                    to_string(ctx.device),
                    " context");
    if (ctx.device == Device::cuda) {
        HYMOE_CHECK(kCudaBuild, op, ": a CUDA context in a build without CUDA (make CUDA=1)");
        HYMOE_CHECK(ctx.stream != nullptr && ctx.arena != nullptr && ctx.blas != nullptr,
                    op,
                    ": a CUDA context without its stream, arena and BLAS handle");
    }
}

}  // namespace

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
    mla_attend(p);
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

// ---- the KDA backward's pieces (backend/ops_kda_backward.h) ------------------------------------

void kda_silu_l2(const Ctx& ctx, const Tensor& c, int64_t K, bool l2, float scale, Tensor& out) {
    check_on(ctx, "kda_silu_l2", {&c, &out});
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda)
            return cu::kda_silu_l2(*ctx.stream, c, K, l2, scale, out);
    kda_silu_l2(c, K, l2, scale, out);
}

void kda_decay_gate_grad(const Ctx& ctx,
                         Tensor& g,
                         const Tensor& a_log,
                         const Tensor& dt_bias,
                         std::optional<float> lower_bound,
                         Tensor& dg_dz) {
    check_on(ctx, "kda_decay_gate_grad", {&g, &a_log, &dt_bias, &dg_dz});
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda)
            return cu::kda_decay_gate_grad(*ctx.stream,
                                           g,
                                           a_log,
                                           dt_bias,
                                           lower_bound.has_value(),
                                           lower_bound.value_or(0.0f),
                                           dg_dz);
    kda_decay_gate_grad(g, a_log, dt_bias, lower_bound, dg_dz);
}

void kda_gated_norm_backward(const Ctx& ctx,
                             const Tensor& o,
                             const Tensor& nrm,
                             const Tensor& gate,
                             const Tensor& w,
                             float eps,
                             const Tensor& don,
                             Tensor& dO,
                             Tensor& dgate) {
    check_on(ctx, "kda_gated_norm_backward", {&o, &nrm, &gate, &w, &don, &dO, &dgate});
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda)
            return cu::kda_gated_norm_backward(*ctx.stream, o, nrm, gate, w, eps, don, dO, dgate);
    kda_gated_norm_backward(o, nrm, gate, w, eps, don, dO, dgate);
}

void kda_silu_l2_backward(
    const Ctx& ctx, const Tensor& c, int64_t K, bool l2, float scale, Tensor& grad) {
    check_on(ctx, "kda_silu_l2_backward", {&c, &grad});
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda)
            return cu::kda_silu_l2_backward(*ctx.stream, c, K, l2, scale, grad);
    kda_silu_l2_backward(c, K, l2, scale, grad);
}

void causal_conv_backward(
    const Ctx& ctx, const KdaSeqTable& t, const Tensor& dc, const Tensor& w, Tensor& du) {
    check_on(ctx, "causal_conv_backward", {&dc, &w, &du});
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda)
            return cu::causal_conv_backward(*ctx.stream, t, dc, w, du);
    causal_conv_backward(t, dc, w, du);
}

void sigmoid_backward(const Ctx& ctx, const Tensor& s, Tensor& d) {
    check_on(ctx, "sigmoid_backward", {&s, &d});
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda)
            return cu::sigmoid_backward(*ctx.stream, s, d);
    sigmoid_backward(s, d);
}

// On CUDA the one-sequence recurrent kernel computes each chunk (as kda_chunked), after the
// state before it is copied to its checkpoint.
void kda_chunked_checkpoints(const Ctx& ctx, const KdaScanParams& p, float* ckpt, int chunk) {
    check_on(ctx, "kda_chunked_checkpoints", {});
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda) {
            HYMOE_CHECK(chunk > 0 && ckpt != nullptr && p.S != nullptr,
                        "kda_chunked_checkpoints: chunk ",
                        chunk);
            const int64_t H = p.n_head, K = p.d_k, V = p.d_v, HKV = H * K * V;
            KdaScanParams c = p;
            for (int64_t t0 = 0, i = 0; t0 < p.n_tok; t0 += chunk, ++i) {
                cu::copy_2d(*ctx.stream, DType::f32, p.S, HKV, ckpt + i * HKV, HKV, 1, HKV);
                c.n_tok = std::min<int64_t>(chunk, p.n_tok - t0);
                c.q = p.q + t0 * H * K;
                c.k = p.k + t0 * H * K;
                c.v = p.v + t0 * H * V;
                c.g = p.g + t0 * H * K;
                c.beta = p.beta + t0 * H;
                c.o = p.o + t0 * H * V;
                cu::kda_recurrent(*ctx.stream, c);
            }
            return;
        }
    kda_chunked_checkpoints(p, ckpt, chunk);
}

// On CUDA the token-by-token backward (cuda_kda_backward.h), its workspace from ctx's arena.
void kda_scan_backward(
    const Ctx& ctx, const KdaScanParams& p, const float* ckpt, const KdaScanGrads& d, int chunk) {
    check_on(ctx, "kda_scan_backward", {});
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda) {
            backend::Scratch scratch(ctx);
            Tensor work =
                scratch(DType::f32,
                        {cu::kda_scan_backward_work(p.n_head, p.d_k, p.d_v, std::max(chunk, 1))});
            return cu::kda_scan_backward(*ctx.stream, p, ckpt, d, chunk, work.ptr<float>());
        }
    kda_scan_backward(p, ckpt, d, chunk);
}

// ---- whole-tensor reductions (backend/ops_reduce.h) ---------------------------------------------

// On CUDA the sum lands in an 8-byte slot of an i64 scratch, read back as a double.
double sum_of_squares(const Ctx& ctx, const Tensor& x) {
    check_on(ctx, "sum_of_squares", {&x});
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda) {
            backend::Scratch scratch(ctx);
            Tensor slot = scratch(DType::i64, {1});
            cu::sum_of_squares(*ctx.stream, x, static_cast<double*>(slot.data));
            double s = 0;
            cu::copy_to_host(&s, slot.data, sizeof(double), *ctx.stream);
            ctx.stream->synchronize();
            return s;
        }
    return sum_of_squares(x);
}

// ---- row moves (backend/ops_rows.h)
// --------------------------------------------------------------

void gather_rows(const Ctx& ctx, const Tensor& src, const Tensor& idx, Tensor& dst) {
    check_on(ctx, "gather_rows", {&src, &idx, &dst});
    HYMOE_CHECK(src.shape.size() == 2 && dst.shape.size() == 2 && src.dtype == dst.dtype &&
                    src.dim(1) == dst.dim(1) && idx.dtype == DType::i64 &&
                    idx.numel() == dst.dim(0),
                "gather_rows: src ",
                shape_string(src.shape),
                ", idx ",
                shape_string(idx.shape),
                ", dst ",
                shape_string(dst.shape));
    if (dst.numel() == 0)
        return;
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda)
            return cu::gather_rows(*ctx.stream, src, idx, dst);
    gather_rows(src, idx, dst);
}

void scatter_rows(const Ctx& ctx, const Tensor& src, const Tensor& idx, Tensor& dst) {
    check_on(ctx, "scatter_rows", {&src, &idx, &dst});
    if (src.numel() == 0)
        return;
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda)
            return cu::scatter_rows(*ctx.stream, src, idx, dst);
    scatter_rows(src, idx, dst);
}

// ---- the router's score backward and the cross-entropy rows (backend/ops_router_loss.h) -------

void router_scores_backward(const Ctx& ctx,
                            const Tensor& s,
                            const Tensor& idx,
                            const Tensor& dw,
                            const Tensor& bias,
                            const RouterGradRule& rule,
                            Tensor& dlogit) {
    check_on(ctx, "router_scores_backward", {&s, &idx, &dw, &bias, &dlogit});
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda)
            return cu::router_scores_backward(*ctx.stream, s, idx, dw, bias, rule, dlogit);
    router_scores_backward(s, idx, dw, bias, rule, dlogit);
}

// On CUDA the rows' losses (8-byte slots of an i64 scratch, read as doubles) and argmaxes come
// back to the host once the stream has reached them.
CrossEntropyRows cross_entropy_rows(const Ctx& ctx,
                                    Tensor& logits,
                                    const Tensor& targets,
                                    double scale) {
    check_on(ctx, "cross_entropy_rows", {&logits, &targets});
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda) {
            const int64_t k = logits.dim(0);
            backend::Scratch scratch(ctx);
            Tensor loss = scratch(DType::i64, {k}), best = scratch(DType::i64, {k});
            cu::cross_entropy_rows(*ctx.stream,
                                   logits,
                                   targets,
                                   scale,
                                   static_cast<double*>(loss.data),
                                   best.ptr<int64_t>());
            CrossEntropyRows out;
            out.loss.resize(static_cast<size_t>(k));
            out.best.resize(static_cast<size_t>(k));
            cu::copy_to_host(
                out.loss.data(), loss.data, out.loss.size() * sizeof(double), *ctx.stream);
            cu::copy_to_host(
                out.best.data(), best.data, out.best.size() * sizeof(int64_t), *ctx.stream);
            ctx.stream->synchronize();
            return out;
        }
    return cross_entropy_rows(logits, targets, scale);
}

// ---- backward and optimizer (backend/ops_backward.h) -------------------------------------------

void rms_norm_backward(
    const Ctx& ctx, const Tensor& x, const Tensor& w, float eps, const Tensor& dy, Tensor& dx) {
    check_on(ctx, "rms_norm_backward", {&x, &w, &dy, &dx});
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda)
            return cu::rms_norm_backward(*ctx.stream, x, w, eps, dy, dx);
    rms_norm_backward(x, w, eps, dy, dx);
}

void linear_backward(const Ctx& ctx, const Tensor& dy, const Tensor& w, Tensor& dx, float beta) {
    check_on(ctx, "linear_backward", {&dy, &w, &dx});
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda) {
            const int64_t out = w.dim(0), in = w.dim(1), n = dy.numel() / std::max<int64_t>(out, 1);
            HYMOE_CHECK(w.shape.size() == 2 && dy.dim(-1) == out && dx.dim(-1) == in &&
                            dx.numel() == n * in && (dy.dtype == w.dtype || dy.dtype == DType::f32),
                        "linear_backward: dy ",
                        to_string(dy.dtype),
                        shape_string(dy.shape),
                        " w ",
                        to_string(w.dtype),
                        shape_string(w.shape),
                        " dx ",
                        shape_string(dx.shape));
            backend::Scratch scratch(ctx);
            Tensor dyc = dy;  // an f32 dy of a bf16 w through a bf16 copy, as linear's x
            if (dy.dtype == DType::f32 && w.dtype == DType::bf16) {
                dyc = scratch(DType::bf16, dy.shape);
                cu::cast(*ctx.stream, dy, dyc);
            }
            return ctx.blas->gemm(w.dtype,
                                  dx.dtype,
                                  false,
                                  false,
                                  n,
                                  in,
                                  out,
                                  1.0f,
                                  dyc.data,
                                  out,
                                  w.data,
                                  in,
                                  beta,
                                  dx.data,
                                  in);
        }
    linear_backward(dy, w, dx, beta);
}

void softmax_rows_backward(const Ctx& ctx, const Tensor& p, Tensor& dp) {
    check_on(ctx, "softmax_rows_backward", {&p, &dp});
    const int64_t n = p.dim(-1);
    HYMOE_CHECK(p.dtype == DType::f32 && dp.dtype == DType::f32 && dp.numel() == p.numel() &&
                    dp.dim(-1) == n,
                "softmax_rows_backward: p ",
                shape_string(p.shape),
                " dp ",
                shape_string(dp.shape));
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda)
            return cu::softmax_rows_backward(*ctx.stream, p, dp);
    softmax_rows_backward(p.ptr<float>(), dp.ptr<float>(), n > 0 ? p.numel() / n : 0, n);
}

// R(pos·θ)ᵀ = R(−pos·θ): the forward's rotation at the negated positions.
void rope_backward(const Ctx& ctx,
                   Tensor& x,
                   int64_t col0,
                   int64_t n_head,
                   int64_t head_stride,
                   const Tensor& pos,
                   const RopeFreqs& freqs,
                   bool interleaved) {
    check_on(ctx, "rope_backward", {&x, &pos});
    HYMOE_CHECK(pos.dtype == DType::i64, "rope_backward: positions of ", to_string(pos.dtype));
    backend::Scratch scratch(ctx);
    Tensor back = scratch(DType::i64, {pos.numel()});
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda)
            cu::negate_i64(*ctx.stream, pos, back);
    if (ctx.device == Device::cpu)
        for (int64_t t = 0; t < pos.numel(); ++t)
            back.ptr<int64_t>()[t] = -pos.ptr<int64_t>()[t];
    rope(ctx, x, col0, n_head, head_stride, back, freqs, interleaved);
}

void swiglu_backward(const Ctx& ctx, Tensor& gate, Tensor& up, const Tensor& dh) {
    check_on(ctx, "swiglu_backward", {&gate, &up, &dh});
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda)
            return cu::swiglu_backward(*ctx.stream, gate, up, dh);
    swiglu_backward(gate, up, dh);
}

void relu2_backward(const Ctx& ctx, Tensor& up, const Tensor& dh) {
    check_on(ctx, "relu2_backward", {&up, &dh});
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda)
            return cu::relu2_backward(*ctx.stream, up, dh);
    relu2_backward(up, dh);
}

void sigmoid_gate_backward(
    const Ctx& ctx, Tensor& du, const Tensor& o, const Tensor& g, Tensor& dz) {
    check_on(ctx, "sigmoid_gate_backward", {&du, &o, &g, &dz});
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda)
            return cu::sigmoid_gate_backward(*ctx.stream, du, o, g, dz);
    sigmoid_gate_backward(du, o, g, dz);
}

void adamw(const Ctx& ctx, Tensor& p, const Tensor& g, Tensor& m, Tensor& v, const AdamWStep& s) {
    check_on(ctx, "adamw", {&p, &g, &m, &v});
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda)
            return cu::adamw(*ctx.stream, p, g, m, v, s);
    adamw(p, g, m, v, s);
}

// ---- MoE groups (backend/ops_moe.h) -------------------------------------------------------------

void moe_gather(const Ctx& ctx, const Tensor& x, const Tensor& row, int64_t k, Tensor& in) {
    check_on(ctx, "moe_gather", {&x, &row, &in});
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda)
            return cu::moe_permute(*ctx.stream, x, row, k, in);
    moe_gather(x, row, nullptr, k, in);
}

void moe_combine(const Ctx& ctx,
                 const Tensor& out,
                 const Tensor& row,
                 const Tensor& weight,
                 int64_t k,
                 Tensor& y) {
    check_on(ctx, "moe_combine", {&out, &row, &weight, &y});
    HYMOE_CHECK(weight.dtype == DType::f32 && weight.numel() == row.numel(),
                "moe_combine: weight ",
                shape_string(weight.shape),
                " for a row map ",
                shape_string(row.shape));
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda)
            return cu::moe_unpermute(*ctx.stream, out, row, weight, k, y);
    moe_combine(out, row, weight.ptr<float>(), k, y);
}

void fill_zero(const Ctx& ctx, Tensor& t) {
    check_on(ctx, "fill_zero", {&t});
    if (t.numel() == 0)
        return;
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda)
            return cu::zero(t.data, t.bytes(), *ctx.stream);
    std::memset(t.data, 0, t.bytes());
}

void cast(const Ctx& ctx, const Tensor& src, Tensor& dst) {
    check_on(ctx, "cast", {&src, &dst});
    const bool f32_bf16 = src.dtype == DType::f32 && dst.dtype == DType::bf16;
    const bool bf16_f32 = src.dtype == DType::bf16 && dst.dtype == DType::f32;
    HYMOE_CHECK(src.numel() == dst.numel() && (src.dtype == dst.dtype || f32_bf16 || bf16_f32),
                "cast: a ",
                to_string(src.dtype),
                " tensor of ",
                shape_string(src.shape),
                " into a ",
                to_string(dst.dtype),
                " one of ",
                shape_string(dst.shape));
    const int64_t n = src.numel();
    if (n == 0)
        return;
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda)
            return cu::cast(*ctx.stream, src, dst);
    if (f32_bf16)
        for (int64_t i = 0; i < n; ++i)
            dst.ptr<uint16_t>()[i] = float_to_bf16(src.ptr<float>()[i]);
    else if (bf16_f32)
        for (int64_t i = 0; i < n; ++i)
            dst.ptr<float>()[i] = bf16_to_float(src.ptr<uint16_t>()[i]);
    else
        std::memcpy(dst.data, src.data, src.bytes());
}

void download(const Ctx& ctx, const Tensor& src, Tensor& host) {
    check_on(ctx, "download", {&src});
    HYMOE_CHECK(
        host.device == Device::cpu && src.dtype == host.dtype && src.numel() == host.numel(),
        "download: a ",
        to_string(src.dtype),
        " tensor of ",
        shape_string(src.shape),
        " into a host ",
        to_string(host.dtype),
        " one of ",
        shape_string(host.shape));
    if (src.numel() == 0)
        return;
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda) {
            cu::download(src, host, *ctx.stream);
            return ctx.stream->synchronize();
        }
    std::memcpy(host.data, src.data, src.bytes());
}

void synchronize(const Ctx& ctx) {
    check_on(ctx, "synchronize", {});
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda)
            ctx.stream->synchronize();
}

void grouped_linear(const Ctx& ctx,
                    const Tensor& x,
                    const std::vector<Tensor>& w,
                    const std::vector<int64_t>& rows,
                    Tensor& y) {
    check_on(ctx, "grouped_linear", {&x, &y});
    HYMOE_CHECK(w.size() == rows.size(),
                "grouped_linear: ",
                w.size(),
                " matrices, ",
                rows.size(),
                " row counts");
    int64_t total = 0;
    for (int64_t r : rows)
        total += r;
    HYMOE_CHECK(x.dim(0) == total && y.dim(0) == total,
                "grouped_linear: x ",
                shape_string(x.shape),
                ", y ",
                shape_string(y.shape),
                " for ",
                total,
                " grouped rows");
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda) {
            // the experts' matrices as one stacked [E, out, in] tensor (consecutive slices)
            if (w.empty())
                return;
            const Tensor& first = w.front();
            check_on(ctx, "grouped_linear", {&first});
            const auto stride = static_cast<int64_t>(first.bytes());
            for (size_t e = 0; e < w.size(); ++e)
                HYMOE_CHECK(w[e].data == static_cast<const char*>(first.data) +
                                             static_cast<int64_t>(e) * stride &&
                                w[e].shape == first.shape && first.data != nullptr,
                            "grouped_linear: expert ",
                            e,
                            "'s matrix is not slice ",
                            e,
                            " of one stacked tensor");
            const Tensor stacked{first.data,
                                 first.dtype,
                                 Device::cuda,
                                 {static_cast<int64_t>(w.size()), first.dim(0), first.dim(1)}};
            return ctx.blas->grouped_linear(x, stacked, rows, y);
        }
    int64_t begin = 0;
    for (size_t e = 0; e < w.size(); ++e) {
        if (rows[e] > 0) {
            Tensor y_rows = y.rows(begin, rows[e]);
            linear(x.rows(begin, rows[e]), w[e], y_rows);
        }
        begin += rows[e];
    }
}

void router_logits(const Ctx& ctx, const Tensor& x, const Tensor& gate, Tensor& logits) {
    check_on(ctx, "router_logits", {&x, &gate, &logits});
    HYMOE_CHECK(logits.dtype == DType::f32 && gate.dtype == DType::f32 &&
                    logits.shape == Shape({x.dim(0), gate.dim(0)}) && x.dim(1) == gate.dim(1),
                "router_logits: x ",
                shape_string(x.shape),
                ", gate ",
                shape_string(gate.shape),
                ", logits ",
                shape_string(logits.shape));
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda)
            return linear(ctx, x, gate, logits);
    for (int64_t t = 0; t < x.dim(0); ++t) {
        Tensor row = logits.rows(t, 1);
        linear(x.rows(t, 1), gate, row);
    }
}

void moe_route(const Ctx& ctx,
               const MoeRouteRule& rule,
               Tensor& logits,
               const Tensor& bias,
               Tensor& idx,
               Tensor& weight) {
    check_on(ctx, "moe_route", {&logits, &bias, &idx, &weight});
    const int64_t n = logits.dim(0), k = rule.top_k;
    HYMOE_CHECK(logits.dtype == DType::f32 && logits.shape == Shape({n, rule.n_exp}) &&
                    (bias.data == nullptr || bias.shape == Shape({rule.n_exp})) &&
                    idx.dtype == DType::i32 && idx.shape == Shape({n, k}) &&
                    weight.dtype == DType::f32 && weight.shape == Shape({n, k}) && k >= 1 &&
                    rule.n_group >= 1 && rule.n_exp % rule.n_group == 0 &&
                    rule.topk_group <= rule.n_group &&
                    k <= rule.topk_group * (rule.n_exp / rule.n_group),
                "moe_route: logits ",
                shape_string(logits.shape),
                ", idx ",
                shape_string(idx.shape),
                ", weight ",
                shape_string(weight.shape),
                ", E ",
                rule.n_exp,
                ", top_k ",
                k,
                ", groups ",
                rule.topk_group,
                " of ",
                rule.n_group);
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda) {
            cu::MoeRouteParams p;
            p.n_tok = static_cast<int>(n);
            p.n_exp = static_cast<int>(rule.n_exp);
            p.top_k = static_cast<int>(k);
            p.n_group = static_cast<int>(rule.n_group);
            p.topk_group = static_cast<int>(rule.topk_group);
            p.softmax = rule.softmax;
            p.renormalize = rule.renormalize;
            p.renorm_eps = rule.renorm_eps;
            p.scale = rule.scale;
            p.weights_from_biased = rule.weights_from_biased;
            p.group_fill = rule.group_fill;
            p.logits = logits.ptr<float>();
            p.bias = bias.data ? bias.ptr<float>() : nullptr;
            p.idx = idx.ptr<int32_t>();
            p.weight = weight.ptr<float>();
            return cu::moe_route(*ctx.stream, p);
        }
    if (rule.softmax)
        softmax_rows(logits.ptr<float>(), n, rule.n_exp);
    else
        sigmoid_inplace(logits);
    std::vector<int64_t> wide(static_cast<size_t>(n * k));  // [n, k]
    moe_select(
        rule, logits, bias.data ? bias.ptr<float>() : nullptr, wide.data(), weight.ptr<float>());
    std::copy(wide.begin(), wide.end(), idx.ptr<int32_t>());
}

}  // namespace ops

}  // namespace hymoe

// ---- the vision tower (backend/ops_vision.h) ----------------------------------------------------
// Its own includes here, so that this section stays one block of the file.

#include "hymoe/backend/cuda_vision.h"
#include "hymoe/backend/ops_vision.h"

namespace hymoe::ops {

void linear_bias(
    const Ctx& ctx, const Tensor& x, const Tensor& w, const Tensor& b, BiasAct act, Tensor& y) {
    check_on(ctx, "linear_bias", {&x, &w, &b, &y});
    linear(ctx, x, w, y);
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda)
            return cu::bias_act(*ctx.stream, y, b, act);
    bias_act(y, b, act);
}

void rope_2d(const Ctx& ctx, Tensor& x, int64_t n_head, int64_t head_dim, const Tensor& pos) {
    check_on(ctx, "rope_2d", {&x, &pos});
    HYMOE_CHECK(x.dtype == DType::f32 && x.shape.size() == 2 && n_head * head_dim <= x.dim(1) &&
                    pos.dtype == DType::i32 && pos.numel() == 2 * x.dim(0),
                "rope_2d: x ",
                shape_string(x.shape),
                " of ",
                n_head,
                " heads of ",
                head_dim,
                ", pos ",
                to_string(pos.dtype),
                shape_string(pos.shape));
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda)
            return cu::rope_2d(*ctx.stream,
                               x.ptr<float>(),
                               x.dim(0),
                               n_head,
                               head_dim,
                               x.dim(1),
                               pos.ptr<int32_t>());
    rope_2d(x.ptr<float>(), x.dim(0), n_head, head_dim, x.dim(1), pos.ptr<int32_t>());
}

int64_t vision_heads_at_once(const Ctx& ctx, int64_t m, int64_t n_head, int64_t scores_bytes) {
    return ctx.device == Device::cuda ? heads_at_once(m, n_head, scores_bytes) : 1;
}

void vision_attention(const Ctx& ctx,
                      const Tensor& qkv,
                      const std::vector<int64_t>& lengths,
                      int64_t n_head,
                      int64_t scores_bytes,
                      Tensor& o) {
    check_on(ctx, "vision_attention", {&qkv, &o});
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda)
            return cu::vision_attention(ctx, qkv, lengths, n_head, scores_bytes, o);
    vision_attention(qkv, lengths, n_head, o);
}

void gather_mean_rows(const Ctx& ctx, const Tensor& x, const Tensor& idx, Tensor& out) {
    check_on(ctx, "gather_mean_rows", {&x, &idx, &out});
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda)
            return cu::gather_mean_rows(*ctx.stream, x, idx, out);
    gather_mean_rows(x, idx, out);
}

}  // namespace hymoe::ops
