// The CPU form of the combine weights' gradient (hymoe/backend/ops_moe_backward.h): a plain
// loop, fp32, columns in order.
#include "hymoe/backend/ops_moe_backward.h"
#include "hymoe/core/error.h"

namespace hymoe::ops {

void moe_slot_dot(const Tensor& g, const Tensor& out, const Tensor& row, int64_t k, Tensor& dw) {
    const int64_t n = g.shape.empty() ? 0 : g.dim(0), width = g.shape.size() == 2 ? g.dim(1) : 0;
    HYMOE_CHECK(g.shape.size() == 2 && out.shape.size() == 2 && out.dim(1) == width &&
                    g.dtype == DType::f32 && out.dtype == DType::f32 && row.dtype == DType::i64 &&
                    k > 0 && row.numel() == n * k && dw.dtype == DType::f32 && dw.numel() == n * k,
                "moe_slot_dot: g ",
                shape_string(g.shape),
                " out ",
                shape_string(out.shape),
                " row map ",
                shape_string(row.shape),
                " dw ",
                shape_string(dw.shape),
                " k ",
                k);
    const int64_t* map = row.ptr<int64_t>();
    for (int64_t a = 0; a < n * k; ++a) {
        const int64_t r = map[a];
        float dot = 0.0f;
        if (r >= 0) {
            const float* gt = g.ptr<float>() + a / k * width;
            const float* o = out.ptr<float>() + r * width;
            for (int64_t c = 0; c < width; ++c)
                dot += gt[c] * o[c];
        }
        dw.ptr<float>()[a] = dot;
    }
}

}  // namespace hymoe::ops
