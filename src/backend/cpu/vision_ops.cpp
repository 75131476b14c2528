// The CPU forms of the vision tower's ops (hymoe/backend/ops_vision.h), in the loop order of the
// host tower they came from (model/vision.cpp before the ops on a Ctx): the bias added row by
// row, then the GELU; the RoPE's angles token by token and pair by pair; the attention image by
// image and head by head as two GEMMs; the means summed from zero and scaled last.
#include <algorithm>
#include <cmath>

#include "hymoe/backend/ops.h"
#include "hymoe/backend/ops_vision.h"
#include "hymoe/core/error.h"

namespace hymoe::ops {

namespace {

float gelu_tanh(float x) {
    const float k = 0.7978845608028654f;  // sqrt(2/π)
    return 0.5f * x * (1.0f + std::tanh(k * (x + 0.044715f * x * x * x)));
}

float gelu_erf(float x) {
    return 0.5f * x * (1.0f + std::erf(x * 0.7071067811865476f));
}

}  // namespace

int64_t heads_at_once(int64_t m, int64_t n_head, int64_t free_bytes) {
    const int64_t one = 4 * m * m;
    return std::clamp<int64_t>(free_bytes / std::max<int64_t>(one, 1), 1, n_head);
}

void bias_act(Tensor& x, const Tensor& b, BiasAct act) {
    HYMOE_CHECK(x.dtype == DType::f32 && b.dtype == DType::f32 && !x.shape.empty() &&
                    b.numel() == x.dim(-1),
                "bias_act: x ",
                to_string(x.dtype),
                shape_string(x.shape),
                " bias ",
                to_string(b.dtype),
                shape_string(b.shape));
    const int64_t w = x.dim(-1), n = w == 0 ? 0 : x.numel() / w;
    float* y = x.ptr<float>();
    const float* bias = b.ptr<float>();
    for (int64_t r = 0; r < n; ++r)
        for (int64_t j = 0; j < w; ++j) {
            float& e = y[r * w + j];
            e += bias[j];
            if (act == BiasAct::gelu_tanh)
                e = gelu_tanh(e);
            else if (act == BiasAct::gelu_erf)
                e = gelu_erf(e);
        }
}

void rope_2d(float* x,
             int64_t n,
             int64_t n_head,
             int64_t head_dim,
             int64_t token_stride,
             const int32_t* pos) {
    HYMOE_CHECK(head_dim % 4 == 0, "rope_2d: head_dim ", head_dim, " (a multiple of 4)");
    const int64_t quarter = head_dim / 4;
    std::vector<float> theta(static_cast<size_t>(quarter));
    for (int64_t i = 0; i < quarter; ++i)
        theta[i] = static_cast<float>(
            std::pow(10000.0, -4.0 * static_cast<double>(i) / static_cast<double>(head_dim)));
    for (int64_t t = 0; t < n; ++t) {
        const float row = static_cast<float>(pos[2 * t]), col = static_cast<float>(pos[2 * t + 1]);
        for (int64_t j = 0; j < head_dim / 2; ++j) {  // pair j: 2i by column, 2i+1 by row
            const float angle = (j % 2 == 0 ? col : row) * theta[j / 2];
            const float c = std::cos(angle), s = std::sin(angle);
            for (int64_t h = 0; h < n_head; ++h) {
                float* e = x + t * token_stride + h * head_dim + 2 * j;
                const float a = e[0], b = e[1];
                e[0] = a * c - b * s;
                e[1] = a * s + b * c;
            }
        }
    }
}

void vision_attention(const Tensor& qkv,
                      const std::vector<int64_t>& lengths,
                      int64_t n_head,
                      Tensor& o) {
    const int64_t n = qkv.dim(0), C = o.dim(1);
    int64_t total = 0;
    for (int64_t m : lengths)
        total += m;
    HYMOE_CHECK(qkv.dtype == DType::f32 && o.dtype == DType::f32 && qkv.dim(1) == 3 * C &&
                    o.dim(0) == n && total == n && n_head > 0 && C % n_head == 0,
                "vision_attention: qkv ",
                shape_string(qkv.shape),
                " o ",
                shape_string(o.shape),
                " over ",
                n_head,
                " heads for ",
                total,
                " patches");
    const int64_t dh = C / n_head;
    const float scale = 1.0f / std::sqrt(static_cast<float>(dh));
    int64_t off = 0;
    for (int64_t m : lengths) {
        const float* q = qkv.ptr<float>() + off * 3 * C;   // [m, 3C] this image's q | k | v
        std::vector<float> s(static_cast<size_t>(m * m));  // [m, m] one head's scores
        for (int64_t h = 0; h < n_head; ++h) {
            gemm(false,
                 true,
                 m,
                 m,
                 dh,
                 scale,
                 q + h * dh,
                 3 * C,
                 q + C + h * dh,
                 3 * C,
                 0.0f,
                 s.data(),
                 m);
            softmax_rows(s.data(), m, m);
            gemm(false,
                 false,
                 m,
                 dh,
                 m,
                 1.0f,
                 s.data(),
                 m,
                 q + 2 * C + h * dh,
                 3 * C,
                 0.0f,
                 o.ptr<float>() + off * C + h * dh,
                 C);
        }
        off += m;
    }
}

void gather_mean_rows(const Tensor& x, const Tensor& idx, Tensor& out) {
    HYMOE_CHECK(x.dtype == DType::f32 && out.dtype == DType::f32 && idx.dtype == DType::i64 &&
                    idx.shape.size() == 2 && idx.dim(1) >= 1 && !x.shape.empty() &&
                    !out.shape.empty() && out.dim(-1) == x.dim(-1) &&
                    out.numel() == idx.dim(0) * out.dim(-1),
                "gather_mean_rows: x ",
                shape_string(x.shape),
                " idx ",
                shape_string(idx.shape),
                " out ",
                shape_string(out.shape));
    const int64_t r = idx.dim(0), g = idx.dim(1), w = x.dim(-1), rows = x.numel() / w;
    const int64_t* at = idx.ptr<int64_t>();
    const float inv = 1.0f / static_cast<float>(g);
    float* o = out.ptr<float>();
    for (int64_t i = 0; i < r; ++i, o += w) {
        std::fill_n(o, w, 0.0f);
        for (int64_t j = 0; j < g; ++j) {
            const int64_t src = at[i * g + j];
            HYMOE_CHECK(src >= 0 && src < rows, "gather_mean_rows: row ", src, " of ", rows);
            const float* e = x.ptr<float>() + src * w;
            for (int64_t k = 0; k < w; ++k)
                o[k] += e[k];
        }
        for (int64_t k = 0; k < w; ++k)
            o[k] *= inv;
    }
}

}  // namespace hymoe::ops
