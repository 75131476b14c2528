// The CPU forms of ops::lora_pair_backward and ops::lora_rows_backward (hymoe/backend/ops_lora.h):
// t = x Aᵀ, g = dy B, dB += s·dyᵀ t, dA += s·gᵀ x, dx = s·g A, each one ops::linear or ops::gemm
// call on contiguous rows (model/lora.cpp's arithmetic, which calls the pair form on each run).
#include <cstring>

#include "hymoe/backend/ops.h"
#include "hymoe/backend/ops_lora.h"
#include "hymoe/core/error.h"

namespace hymoe::ops {

namespace {

// The rows idx [m] of src [n, w] into dst [m, w].
void gather(const Tensor& src, const int64_t* idx, int64_t m, Buffer& dst) {
    const int64_t w = src.dim(1);
    dst = Buffer(DType::f32, {m, w});
    for (int64_t i = 0; i < m; ++i)
        std::memcpy(dst.ptr<float>() + i * w, src.ptr<float>() + idx[i] * w, w * sizeof(float));
}

}  // namespace

void lora_pair_backward(const Tensor& A,
                        const Tensor& B,
                        float scale,
                        const Tensor& x,
                        const Tensor& dy,
                        Tensor& dA,
                        Tensor& dB,
                        Tensor& dx,
                        float beta) {
    const int64_t m = x.dim(0), r = A.dim(0), in = A.dim(1), out = B.dim(0);
    const bool train = dA.data != nullptr;
    HYMOE_CHECK(A.dtype == DType::f32 && B.dtype == DType::f32 && x.dtype == DType::f32 &&
                    dy.dtype == DType::f32 && dx.dtype == DType::f32 && x.dim(1) == in &&
                    B.dim(1) == r && dy.dim(0) == m && dy.dim(1) == out && dx.shape == x.shape &&
                    (!train || (dA.shape == A.shape && dB.shape == B.shape)),
                "lora_pair_backward: x ",
                shape_string(x.shape),
                ", dy ",
                shape_string(dy.shape),
                ", A ",
                shape_string(A.shape),
                ", B ",
                shape_string(B.shape));
    Buffer t(DType::f32, {m, r});  // x Aᵀ
    linear(x, A, t.view());
    Buffer g(DType::f32, {m, r});  // dy B
    gemm(false,
         false,
         m,
         r,
         out,
         1.0f,
         dy.ptr<float>(),
         out,
         B.ptr<float>(),
         r,
         0.0f,
         g.ptr<float>(),
         r);
    if (train) {
        gemm(true,
             false,
             out,
             r,
             m,
             scale,
             dy.ptr<float>(),
             out,
             t.ptr<float>(),
             r,
             1.0f,
             dB.ptr<float>(),
             r);
        gemm(true,
             false,
             r,
             in,
             m,
             scale,
             g.ptr<float>(),
             r,
             x.ptr<float>(),
             in,
             1.0f,
             dA.ptr<float>(),
             in);
    }
    gemm(false,
         false,
         m,
         in,
         r,
         scale,
         g.ptr<float>(),
         r,
         A.ptr<float>(),
         in,
         beta,
         dx.ptr<float>(),
         in);
}

void lora_rows_backward(const Tensor& rows,
                        const Tensor& A,
                        const Tensor& B,
                        float scale,
                        const Tensor& x,
                        const Tensor& dy,
                        Tensor& dA,
                        Tensor& dB,
                        Tensor& dx) {
    const int64_t m = rows.numel(), n = x.dim(0), in = x.dim(1);
    HYMOE_CHECK(rows.dtype == DType::i64 && x.dtype == DType::f32 && dy.dtype == DType::f32 &&
                    dx.dtype == DType::f32 && dy.dim(0) == n && dx.shape == x.shape,
                "lora_rows_backward: x ",
                shape_string(x.shape),
                ", dy ",
                shape_string(dy.shape),
                ", dx ",
                shape_string(dx.shape));
    const int64_t* idx = rows.ptr<int64_t>();
    for (int64_t i = 0; i < m; ++i)
        HYMOE_CHECK(idx[i] >= 0 && idx[i] < n, "lora_rows_backward: row ", idx[i], " of ", n);
    Buffer xg, dyg;  // [m, in], [m, out]
    gather(x, idx, m, xg);
    gather(dy, idx, m, dyg);
    Buffer dxg(DType::f32, {m, in});  // [m, in]
    Tensor dxv = dxg.view();
    lora_pair_backward(A, B, scale, xg.view(), dyg.view(), dA, dB, dxv);
    for (int64_t i = 0; i < m; ++i) {
        float* d = dx.ptr<float>() + idx[i] * in;
        for (int64_t c = 0; c < in; ++c)
            d[c] += dxg.ptr<float>()[i * in + c];
    }
}

}  // namespace hymoe::ops
