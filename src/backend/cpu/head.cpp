// The CPU forms of the model's two ends (hymoe/backend/ops_head.h): the embedding rows widened
// from the table's storage dtype, and each logits row's top tokens with its log-sum in double.
#include <algorithm>
#include <cmath>

#include "hymoe/backend/ops.h"
#include "hymoe/backend/ops_head.h"
#include "hymoe/core/error.h"

namespace hymoe::ops {

void embed_rows(const Tensor& table, const Tensor& tokens, int64_t lo, Tensor& h) {
    const int64_t n = tokens.numel(), d = table.dim(-1), rows = table.dim(0);
    HYMOE_CHECK(table.shape.size() == 2 && tokens.dtype == DType::i64 && h.dtype == DType::f32 &&
                    h.shape == (Shape{n, d}),
                "embed_rows: table ",
                shape_string(table.shape),
                " tokens ",
                shape_string(tokens.shape),
                " h ",
                shape_string(h.shape));
    const auto es = static_cast<int64_t>(dtype_size(table.dtype));
    for (int64_t t = 0; t < n; ++t) {
        const int64_t r = tokens.ptr<int64_t>()[t] - lo;
        float* out = h.ptr<float>() + t * d;
        if (r < 0 || r >= rows) {
            std::fill_n(out, d, 0.0f);
            continue;
        }
        const void* row = static_cast<const char*>(table.data) + r * d * es;
        if (table.dtype == DType::f32) {
            std::copy_n(static_cast<const float*>(row), d, out);
            continue;
        }
        HYMOE_CHECK(table.dtype == DType::bf16 || table.dtype == DType::f16,
                    "embed_rows: a table of ",
                    to_string(table.dtype));
        const auto* in = static_cast<const uint16_t*>(row);
        for (int64_t j = 0; j < d; ++j)
            out[j] = table.dtype == DType::bf16 ? bf16_to_float(in[j]) : f16_to_float(in[j]);
    }
}

void top_logits(const Tensor& logits, Tensor& idx, Tensor& values, Tensor& log_sum) {
    const int64_t V = logits.dim(-1), r = logits.numel() / std::max<int64_t>(V, 1);
    const int64_t n = idx.numel() / std::max<int64_t>(r, 1);
    for (int64_t i = 0; i < r; ++i) {
        const float* x = logits.ptr<float>() + i * V;
        int64_t* top = idx.ptr<int64_t>() + i * n;
        top_k(x, V, n, top);
        for (int64_t j = 0; j < n; ++j)
            values.ptr<float>()[i * n + j] = x[top[j]];
        const double mx = static_cast<double>(x[top[0]]);
        double sum = 0;
        for (int64_t j = 0; j < V; ++j)
            sum += std::exp(static_cast<double>(x[j]) - mx);
        static_cast<double*>(log_sum.data)[i] = std::log(sum);
    }
}

}  // namespace hymoe::ops
