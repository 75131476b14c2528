// The CPU forms of the KDA block's elementwise ops (hymoe/backend/ops_kda.h): plain fp32 loops,
// the arithmetic model/kda.cpp ran inline before they were ops.
#include <cmath>

#include "hymoe/backend/ops.h"
#include "hymoe/backend/ops_kda.h"
#include "hymoe/core/error.h"

namespace hymoe::ops {

namespace {

void check_f32(const Tensor& t, const char* op) {
    HYMOE_CHECK(t.dtype == DType::f32 && t.device == Device::cpu,
                op,
                ": expected an fp32 host tensor, got ",
                to_string(t.dtype),
                " on ",
                to_string(t.device));
}

}  // namespace

void kda_decay_gate(Tensor& g,
                    const Tensor& a_log,
                    const Tensor& dt_bias,
                    std::optional<float> lower_bound) {
    for (const Tensor* t : {static_cast<const Tensor*>(&g), &a_log, &dt_bias})
        check_f32(*t, "kda_decay_gate");
    const int64_t H = a_log.numel(), D = dt_bias.numel();
    HYMOE_CHECK(H > 0 && D % H == 0 && g.dim(-1) == D,
                "kda_decay_gate: g ",
                shape_string(g.shape),
                " a_log ",
                shape_string(a_log.shape),
                " dt_bias ",
                shape_string(dt_bias.shape));
    const int64_t K = D / H, n_tok = g.numel() / D;
    const float* al = a_log.ptr<float>();  // [H]
    const float* bias = dt_bias.ptr<float>();
    float* gp = g.ptr<float>();
    for (int64_t t = 0; t < n_tok; ++t) {
        for (int64_t h = 0; h < H; ++h) {
            const float a = std::exp(al[h]);
            for (int64_t i = h * K; i < (h + 1) * K; ++i) {
                float& x = gp[t * D + i];
                const float z = x + bias[i];
                x = lower_bound ? *lower_bound * sigmoid(a * z) : -a * softplus(z);
            }
        }
    }
}

void scale_inplace(Tensor& x, float c) {
    check_f32(x, "scale_inplace");
    float* p = x.ptr<float>();
    const int64_t n = x.numel();
    for (int64_t i = 0; i < n; ++i)
        p[i] *= c;
}

void mul_inplace(Tensor& x, const Tensor& y) {
    check_f32(x, "mul_inplace");
    check_f32(y, "mul_inplace");
    HYMOE_CHECK(x.numel() == y.numel(),
                "mul_inplace: x ",
                shape_string(x.shape),
                " y ",
                shape_string(y.shape));
    float* p = x.ptr<float>();
    const float* q = y.ptr<float>();
    const int64_t n = x.numel();
    for (int64_t i = 0; i < n; ++i)
        p[i] *= q[i];
}

}  // namespace hymoe::ops
