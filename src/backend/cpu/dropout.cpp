// The CPU form of ops::dropout_rows (backend/ops_dropout.h): lora.h's draw, row by row.
#include "hymoe/backend/ops_dropout.h"
#include "hymoe/core/error.h"
#include "hymoe/core/rng.h"

namespace hymoe::ops {

void check_dropout_rows(const Tensor& x, const DropoutKey& key, const Tensor& y) {
    HYMOE_CHECK(x.dtype == DType::f32 && y.dtype == DType::f32 && x.shape == y.shape &&
                    x.shape.size() == 2 && key.p >= 0 && key.p < 1,
                "dropout_rows: x ",
                shape_string(x.shape),
                ", y ",
                shape_string(y.shape),
                ", p ",
                key.p);
}

void dropout_rows(const Tensor& x, const DropoutKey& key, Tensor& y) {
    check_dropout_rows(x, key, y);
    const int64_t n = x.dim(0), in = x.dim(1);
    const float keep = 1.0f - key.p, kept = 1.0f / keep;
    for (int64_t r = 0; r < n; ++r) {
        Philox rng(key.seed, key.stream, static_cast<uint32_t>(r));
        const float* src = x.ptr<float>() + r * in;
        float* dst = y.ptr<float>() + r * in;
        for (int64_t c = 0; c < in; ++c)
            dst[c] = src[c] * (rng.uniform() < keep ? kept : 0.0f);
    }
}

}  // namespace hymoe::ops
