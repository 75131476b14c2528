// The training ops on a Ctx (hymoe/backend/ops.h's switch, continued): the KDA backward's pieces,
// whole-tensor reductions, row moves, the router's score backward and the cross-entropy rows,
// the blocks' backward and the optimizer step. Each checks its tensors, then runs the CPU op or
// queues the CUDA kernel of the same name and semantics (src/backend/ops_switch.h).
#include <cstring>
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
#include "ops_switch.h"

namespace hymoe::ops {

using namespace backend::detail;

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

// On CUDA each sum lands in its slot of one i64 scratch, read back at once.
void sums_of_squares(const Ctx& ctx, std::span<const Tensor> xs, std::span<double> out) {
    HYMOE_CHECK(
        xs.size() == out.size(), "sums_of_squares: ", xs.size(), " tensors, ", out.size(), " sums");
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda && !xs.empty()) {
            backend::Scratch scratch(ctx);
            Tensor slots = scratch(DType::i64, {static_cast<int64_t>(xs.size())});
            for (size_t i = 0; i < xs.size(); ++i) {
                check_on(ctx, "sums_of_squares", {&xs[i]});
                cu::sum_of_squares(*ctx.stream, xs[i], static_cast<double*>(slots.data) + i);
            }
            cu::copy_to_host(out.data(), slots.data, xs.size() * sizeof(double), *ctx.stream);
            ctx.stream->synchronize();
            return;
        }
    for (size_t i = 0; i < xs.size(); ++i)
        out[i] = sum_of_squares(ctx, xs[i]);
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

}  // namespace hymoe::ops
