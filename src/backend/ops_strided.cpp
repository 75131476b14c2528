// The strided-matrix ops on a Ctx (backend/ops_strided.h): each checks that its matrices lie in
// their tensors on ctx's device, then runs the CPU form on host pointers or queues the CUDA
// product, copy or softmax (src/backend/ops_switch.h).
#include "hymoe/backend/ops_strided.h"

#include <cstring>
#include <limits>

#include "hymoe/backend/cuda_gemm.h"
#include "hymoe/backend/cuda_model_ops.h"
#include "hymoe/backend/ops.h"
#include "ops_switch.h"

namespace hymoe::ops {

using namespace backend::detail;

namespace {

// `a` holds a rows × cols matrix (f32, inside its tensor); returns its first element.
float* first_of(const MatRef& a, int64_t rows, int64_t cols, const char* op, const char* name) {
    HYMOE_CHECK(a.t.dtype == DType::f32 && a.offset >= 0 && rows >= 0 && cols >= 0 &&
                    (rows <= 1 || a.ld >= cols) &&
                    (rows == 0 || cols == 0 || a.offset + (rows - 1) * a.ld + cols <= a.t.numel()),
                op,
                ": ",
                name,
                " [",
                rows,
                ", ",
                cols,
                "] at ",
                a.offset,
                " stride ",
                a.ld,
                " outside its ",
                to_string(a.t.dtype),
                shape_string(a.t.shape));
    return a.t.ptr<float>() + a.offset;
}

}  // namespace

void gemm(const Ctx& ctx,
          bool trans_a,
          bool trans_b,
          int64_t m,
          int64_t n,
          int64_t k,
          float alpha,
          const MatRef& a,
          const MatRef& b,
          float beta,
          const MatRef& c) {
    check_on(ctx, "gemm", {&a.t, &b.t, &c.t});
    const float* pa = first_of(a, trans_a ? k : m, trans_a ? m : k, "gemm", "A");
    const float* pb = first_of(b, trans_b ? n : k, trans_b ? k : n, "gemm", "B");
    float* pc = first_of(c, m, n, "gemm", "C");
    if (m == 0 || n == 0)
        return;
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda)
            return ctx.blas->gemm(DType::f32,
                                  DType::f32,
                                  trans_a,
                                  trans_b,
                                  m,
                                  n,
                                  k,
                                  alpha,
                                  pa,
                                  a.ld,
                                  pb,
                                  b.ld,
                                  beta,
                                  pc,
                                  c.ld);
    gemm(trans_a, trans_b, m, n, k, alpha, pa, a.ld, pb, b.ld, beta, pc, c.ld);
}

void copy_block(const Ctx& ctx, int64_t rows, int64_t cols, const MatRef& src, const MatRef& dst) {
    check_on(ctx, "copy_block", {&src.t, &dst.t});
    const float* from = first_of(src, rows, cols, "copy_block", "src");
    float* to = first_of(dst, rows, cols, "copy_block", "dst");
    if (rows == 0 || cols == 0)
        return;
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda)
            return cu::copy_2d(*ctx.stream, DType::f32, from, src.ld, to, dst.ld, rows, cols);
    for (int64_t r = 0; r < rows; ++r)
        std::memcpy(to + r * dst.ld, from + r * src.ld, static_cast<size_t>(cols) * sizeof(float));
}

void causal_softmax(const Ctx& ctx, Tensor& scores, int64_t pos_first, const Tensor* mask) {
    const Tensor none;
    check_on(ctx, "causal_softmax", {&scores, mask ? mask : &none});
    HYMOE_CHECK(scores.dtype == DType::f32 && scores.shape.size() == 2 && pos_first >= 0 &&
                    (mask == nullptr || (mask->dtype == DType::f32 && mask->shape == scores.shape)),
                "causal_softmax: scores ",
                shape_string(scores.shape),
                " mask ",
                mask ? shape_string(mask->shape) : "none");
    const int64_t n_q = scores.dim(0), n_k = scores.dim(1);
    if constexpr (kCudaBuild)
        if (ctx.device == Device::cuda)
            return cu::causal_softmax(*ctx.stream, scores, 1, pos_first, mask);
    float* x = scores.ptr<float>();
    const float* mk = mask ? mask->ptr<float>() : nullptr;
    for (int64_t i = 0; i < n_q; ++i)
        for (int64_t u = 0; u < n_k; ++u) {
            float& v = x[i * n_k + u];
            v = u <= pos_first + i ? v + (mk ? mk[i * n_k + u] : 0.0f)
                                   : -std::numeric_limits<float>::infinity();
        }
    softmax_rows(x, n_q, n_k);
}

}  // namespace hymoe::ops
