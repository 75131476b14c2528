// The CPU form of ops::lora_rows_add (hymoe/backend/ops_lora.h): the rows gathered, t = x Aᵀ,
// t ← scale · t, y += t Bᵀ, the rows scattered back.
#include <cstring>

#include "hymoe/backend/ops.h"
#include "hymoe/backend/ops_lora.h"
#include "hymoe/core/error.h"

namespace hymoe::ops {

void lora_rows_add(
    const Tensor& rows, const Tensor& A, const Tensor& B, float scale, const Tensor& x, Tensor& y) {
    const int64_t m = rows.numel(), r = A.dim(0), in = A.dim(1), out = B.dim(0);
    const int64_t n = x.dim(0);
    HYMOE_CHECK(rows.dtype == DType::i64 && x.dtype == DType::f32 && y.dtype == DType::f32 &&
                    A.dtype == DType::f32 && B.dtype == DType::f32 && x.dim(1) == in &&
                    B.dim(1) == r && y.dim(0) == n && y.dim(1) == out,
                "lora_rows_add: x ",
                shape_string(x.shape),
                ", y ",
                shape_string(y.shape),
                ", A ",
                shape_string(A.shape),
                ", B ",
                shape_string(B.shape));
    Buffer xg(DType::f32, {m, in}), yg(DType::f32, {m, out}), t(DType::f32, {m, r});
    const int64_t* idx = rows.ptr<int64_t>();
    for (int64_t i = 0; i < m; ++i) {
        HYMOE_CHECK(idx[i] >= 0 && idx[i] < n, "lora_rows_add: row ", idx[i], " of ", n);
        std::memcpy(xg.ptr<float>() + i * in, x.ptr<float>() + idx[i] * in, in * sizeof(float));
        std::memcpy(yg.ptr<float>() + i * out, y.ptr<float>() + idx[i] * out, out * sizeof(float));
    }
    linear(xg.view(), A, t.view());
    for (int64_t i = 0; i < m * r; ++i)
        t.ptr<float>()[i] *= scale;
    Tensor ygv = yg.view();
    linear(t.view(), B, ygv, 1.0f);
    for (int64_t i = 0; i < m; ++i)
        std::memcpy(y.ptr<float>() + idx[i] * out, yg.ptr<float>() + i * out, out * sizeof(float));
}

}  // namespace hymoe::ops
