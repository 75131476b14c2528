// The CPU reference implementation of backend/ops.h: plain loops in fp32, hymoe's AVX-512 GEMM
// (gemm_f32.h) or BLAS (OpenBLAS sgemm / sgemv) for the matrix products. Shapes are checked here,
// once per call.
#include "hymoe/backend/ops.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <numeric>
#include <vector>

#include <cblas.h>

#include "expf_avx512.h"
#include "gemm_f32.h"
#include "hymoe/core/error.h"
#include "hymoe/core/f32x4.h"
#include "hymoe/core/timer.h"
#include "weight_kernels.h"

namespace hymoe::ops {

namespace {

int64_t rows_of(const Tensor& t) {
    return t.numel() / std::max<int64_t>(t.dim(-1), 1);
}

void check_f32(const Tensor& t, const char* op) {
    HYMOE_CHECK(t.dtype == DType::f32 && t.device == Device::cpu,
                op,
                ": expected an fp32 host ",
                "tensor, got ",
                to_string(t.dtype),
                " on ",
                to_string(t.device));
}

}  // namespace

namespace {
bool batch_invariant = false;
constexpr int64_t kInvariantRows = 8;
// Below these hymoe's GEMM leaves the product to OpenBLAS: one row goes to sgemv, and under 16
// columns a 64-column panel is mostly padding (measured: docs/guide/performance.md).
constexpr int64_t kOwnMinRows = 2, kOwnMinCols = 16;
}  // namespace

void set_batch_invariant(bool on) {
    batch_invariant = on;
}

bool detail::batch_invariant_on() {
    return batch_invariant;
}

GemmCounter& gemm_counter() {
    static GemmCounter counter;
    return counter;
}

void gemm(bool trans_a,
          bool trans_b,
          int64_t m,
          int64_t n,
          int64_t k,
          float alpha,
          const float* a,
          int64_t lda,
          const float* b,
          int64_t ldb,
          float beta,
          float* c,
          int64_t ldc) {
    if (m == 0 || n == 0)
        return;
    HYMOE_CHECK(std::max({m, n, k, lda, ldb, ldc}) <= INT_MAX,
                "gemm: ",
                m,
                "x",
                n,
                "x",
                k,
                " exceeds the 32-bit BLAS interface");
    const double t0 = wall_seconds();
    if (detail::f32_avx512_on() && (batch_invariant || (m >= kOwnMinRows && n >= kOwnMinCols))) {
        detail::f32_gemm_avx512(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    } else if (batch_invariant && !trans_a && m != kInvariantRows) {
        const int64_t full = m / kInvariantRows * kInvariantRows, tail = m - full;
        for (int64_t i = 0; i < full; i += kInvariantRows)
            gemm(false,
                 trans_b,
                 kInvariantRows,
                 n,
                 k,
                 alpha,
                 a + i * lda,
                 lda,
                 b,
                 ldb,
                 beta,
                 c + i * ldc,
                 ldc);
        if (tail > 0) {
            std::vector<float> pa(static_cast<size_t>(kInvariantRows * k), 0.0f);  // [8, k]
            std::vector<float> pc(static_cast<size_t>(kInvariantRows * n), 0.0f);  // [8, n]
            for (int64_t i = 0; i < tail; ++i) {
                std::copy_n(a + (full + i) * lda, k, pa.data() + i * k);
                std::copy_n(c + (full + i) * ldc, n, pc.data() + i * n);
            }
            gemm(false,
                 trans_b,
                 kInvariantRows,
                 n,
                 k,
                 alpha,
                 pa.data(),
                 k,
                 b,
                 ldb,
                 beta,
                 pc.data(),
                 n);
            for (int64_t i = 0; i < tail; ++i)
                std::copy_n(pc.data() + i * n, n, c + (full + i) * ldc);
        }
        return;
    } else if (m == 1 && !trans_a) {  // one row: gemv, which OpenBLAS does not pick by itself
        // c[0, :] = alpha · op(B)ᵀ a + beta · c  (B [k, n] or Bᵀ [n, k])
        cblas_sgemv(CblasRowMajor,
                    trans_b ? CblasNoTrans : CblasTrans,
                    static_cast<int>(trans_b ? n : k),
                    static_cast<int>(trans_b ? k : n),
                    alpha,
                    b,
                    static_cast<int>(ldb),
                    a,
                    1,
                    beta,
                    c,
                    1);
    } else {
        cblas_sgemm(CblasRowMajor,
                    trans_a ? CblasTrans : CblasNoTrans,
                    trans_b ? CblasTrans : CblasNoTrans,
                    static_cast<int>(m),
                    static_cast<int>(n),
                    static_cast<int>(k),
                    alpha,
                    a,
                    static_cast<int>(lda),
                    b,
                    static_cast<int>(ldb),
                    beta,
                    c,
                    static_cast<int>(ldc));
    }
    GemmCounter& counter = gemm_counter();
    counter.seconds += wall_seconds() - t0;
    counter.flops += 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
}

void linear(const Tensor& x, const Tensor& w, Tensor& y, float beta) {
    check_f32(x, "linear");
    check_f32(y, "linear");
    HYMOE_CHECK(w.shape.size() == 2 && x.dim(-1) == w.dim(1) && y.dim(-1) == w.dim(0) &&
                    rows_of(x) == rows_of(y),
                "linear: x ",
                shape_string(x.shape),
                " w ",
                shape_string(w.shape),
                " y ",
                shape_string(y.shape));
    const int64_t n = rows_of(x), in = w.dim(1), out = w.dim(0);
    gemm_w(
        true, n, out, in, 1.0f, x.ptr<float>(), in, weight_ref(w), in, beta, y.ptr<float>(), out);
}

void rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor& y) {
    const int64_t dim = x.dim(-1), rows = rows_of(x);
    HYMOE_CHECK(w.numel() == dim && y.numel() == x.numel(),
                "rms_norm: x ",
                shape_string(x.shape),
                " w ",
                shape_string(w.shape),
                " y ",
                shape_string(y.shape));
    const float* wp = w.ptr<float>();
    for (int64_t r = 0; r < rows; ++r) {
        const float* xr = x.ptr<float>() + r * dim;
        float* yr = y.ptr<float>() + r * dim;
        double ss = 0;
        for (int64_t i = 0; i < dim; ++i)
            ss += static_cast<double>(xr[i]) * static_cast<double>(xr[i]);
        const float scale =
            1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(dim)) + eps);
        for (int64_t i = 0; i < dim; ++i)
            yr[i] = wp[i] * (xr[i] * scale);
    }
}

void layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, float eps, Tensor& y) {
    const int64_t dim = x.dim(-1), rows = rows_of(x);
    HYMOE_CHECK(w.numel() == dim && b.numel() == dim && y.numel() == x.numel(),
                "layer_norm: x ",
                shape_string(x.shape),
                " w ",
                shape_string(w.shape),
                " b ",
                shape_string(b.shape));
    for (int64_t r = 0; r < rows; ++r) {
        const float* xr = x.ptr<float>() + r * dim;
        float* yr = y.ptr<float>() + r * dim;
        double mean = 0, var = 0;
        for (int64_t i = 0; i < dim; ++i)
            mean += static_cast<double>(xr[i]);
        mean /= static_cast<double>(dim);
        for (int64_t i = 0; i < dim; ++i)
            var += (static_cast<double>(xr[i]) - mean) * (static_cast<double>(xr[i]) - mean);
        var /= static_cast<double>(dim);
        const float inv = 1.0f / std::sqrt(static_cast<float>(var) + eps);
        const float m = static_cast<float>(mean);
        for (int64_t i = 0; i < dim; ++i)
            yr[i] = (xr[i] - m) * inv * w.ptr<float>()[i] + b.ptr<float>()[i];
    }
}

void l2_norm_rows(float* x, int64_t rows, int64_t dim, float eps) {
    for (int64_t r = 0; r < rows; ++r) {
        float* xr = x + r * dim;
        double ss = 0;
        for (int64_t i = 0; i < dim; ++i)
            ss += static_cast<double>(xr[i]) * static_cast<double>(xr[i]);
        const float inv = 1.0f / std::sqrt(static_cast<float>(ss) + eps);
        for (int64_t i = 0; i < dim; ++i)
            xr[i] *= inv;
    }
}

float sigmoid(float x) {
    return 1.0f / (1.0f + std::exp(-x));
}
float silu(float x) {
    return x * sigmoid(x);
}
float softplus(float x) {
    return x > 20.0f ? x : std::log1p(std::exp(x));
}

namespace {

// y[i] = sigmoid(x[i]), times x[i] for SiLU, times u[i] when u is given: e^{−x} for a block
// (expf_array: libm's expf, in AVX-512 lanes where it can), then 1 / (1 + e) and the products
// four lanes at a time, each lane rounding as the scalar sigmoid / silu do (the same results
// bit for bit).
// y may alias x or u.
template <bool Silu>
void sigmoid_times(const float* x, const float* u, float* y, int64_t n) {
    constexpr int64_t block = 512;
    float e[block];
    for (int64_t i0 = 0; i0 < n; i0 += block) {
        const int64_t len = std::min(block, n - i0);
        detail::expf_array(x + i0, true, e, len);
        int64_t i = 0;
        for (; i + 4 <= len; i += 4) {
            f32x4 s = 1.0f / (1.0f + load4(e + i));
            if constexpr (Silu)
                s = load4(x + i0 + i) * s;
            if (u)
                s = s * load4(u + i0 + i);
            store4(y + i0 + i, s);
        }
        for (; i < len; ++i) {
            float s = 1.0f / (1.0f + e[i]);
            if constexpr (Silu)
                s = x[i0 + i] * s;
            if (u)
                s = s * u[i0 + i];
            y[i0 + i] = s;
        }
    }
}

}  // namespace

void silu_inplace(Tensor& x) {
    sigmoid_times<true>(x.ptr<float>(), nullptr, x.ptr<float>(), x.numel());
}

void sigmoid_inplace(Tensor& x) {
    sigmoid_times<false>(x.ptr<float>(), nullptr, x.ptr<float>(), x.numel());
}

void swiglu(const Tensor& gate, const Tensor& up, Tensor& y) {
    HYMOE_CHECK(gate.numel() == up.numel() && y.numel() == up.numel(),
                "swiglu: gate ",
                shape_string(gate.shape),
                " up ",
                shape_string(up.shape));
    sigmoid_times<true>(gate.ptr<float>(), up.ptr<float>(), y.ptr<float>(), y.numel());
}

void add_inplace(Tensor& x, const Tensor& y) {
    HYMOE_CHECK(
        x.numel() == y.numel(), "add: ", shape_string(x.shape), " + ", shape_string(y.shape));
    float* a = x.ptr<float>();
    const float* b = y.ptr<float>();
    const int64_t n = x.numel();
    for (int64_t i = 0; i < n; ++i)
        a[i] += b[i];
}

void relu2_inplace(Tensor& x) {
    check_f32(x, "relu2_inplace");
    float* p = x.ptr<float>();
    const int64_t n = x.numel();
    for (int64_t i = 0; i < n; ++i) {
        const float r = p[i] > 0.0f ? p[i] : 0.0f;
        p[i] = r * r;
    }
}

void softmax_rows(float* x, int64_t rows, int64_t n) {
    for (int64_t r = 0; r < rows; ++r) {
        float* xr = x + r * n;
        float mx = -INFINITY;
        for (int64_t i = 0; i < n; ++i)
            mx = std::max(mx, xr[i]);
        if (mx == -INFINITY) {  // every entry masked: no probability anywhere
            std::fill(xr, xr + n, 0.0f);
            continue;
        }
        double sum = 0;
        for (int64_t i = 0; i < n; ++i) {
            xr[i] = std::exp(xr[i] - mx);
            sum += static_cast<double>(xr[i]);
        }
        const float inv = static_cast<float>(1.0 / sum);
        for (int64_t i = 0; i < n; ++i)
            xr[i] *= inv;
    }
}

RopeFreqs rope_freqs(int rot_dim, double base) {
    RopeFreqs f;
    for (int i = 0; i < rot_dim / 2; ++i)
        f.theta.push_back(static_cast<float>(std::pow(base, -2.0 * i / rot_dim)));
    return f;
}

// YaRN (DeepSeek-V3 inference/model.py precompute_freqs_cis): dims whose wavelength fits the
// original context keep θ, long-wavelength dims are divided by `factor`, with a linear ramp
// between the correction range [low, high] found from beta_fast/beta_slow rotations.
RopeFreqs rope_freqs_yarn(int rot_dim,
                          double base,
                          double factor,
                          int64_t original_max_pos,
                          double beta_fast,
                          double beta_slow,
                          double mscale) {
    RopeFreqs f = rope_freqs(rot_dim, base);
    auto correction_dim = [&](double rotations) {
        return rot_dim * std::log(static_cast<double>(original_max_pos) / (rotations * 2 * M_PI)) /
               (2 * std::log(base));
    };
    double low = std::max(std::floor(correction_dim(beta_fast)), 0.0);
    double high = std::min(std::ceil(correction_dim(beta_slow)), rot_dim - 1.0);
    if (low == high)
        high += 0.001;
    for (int i = 0; i < rot_dim / 2; ++i) {
        double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
        double smooth = 1.0 - ramp;
        const double theta = f.theta[i];
        f.theta[i] = static_cast<float>(theta / factor * (1.0 - smooth) + theta * smooth);
    }
    f.mscale = static_cast<float>(mscale);
    return f;
}

void rope(float* x,
          int64_t n_tok,
          int64_t n_head,
          int64_t token_stride,
          int64_t head_stride,
          const int64_t* pos,
          const RopeFreqs& freqs,
          bool interleaved) {
    const int64_t half = static_cast<int64_t>(freqs.theta.size());
    for (int64_t t = 0; t < n_tok; ++t) {
        for (int64_t i = 0; i < half; ++i) {
            const double angle = static_cast<double>(pos[t]) * static_cast<double>(freqs.theta[i]);
            const float c = static_cast<float>(std::cos(angle)) * freqs.mscale;
            const float s = static_cast<float>(std::sin(angle)) * freqs.mscale;
            for (int64_t h = 0; h < n_head; ++h) {
                float* v = x + t * token_stride + h * head_stride;
                float* a = interleaved ? v + 2 * i : v + i;
                float* b = interleaved ? v + 2 * i + 1 : v + i + half;
                const float x0 = *a, x1 = *b;
                *a = x0 * c - x1 * s;
                *b = x0 * s + x1 * c;
            }
        }
    }
}

void top_k(const float* x, int64_t n, int64_t k, int64_t* idx) {
    HYMOE_CHECK(k >= 0 && k <= n, "top_k: k = ", k, " of ", n);
    std::vector<int64_t> order(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int64_t a, int64_t b) {
        return x[a] > x[b] || (x[a] == x[b] && a < b);
    });
    std::copy(order.begin(), order.begin() + k, idx);
}

void causal_conv(const Tensor& u, const Tensor& w, Tensor& tail, Tensor& y) {
    const int64_t T = u.dim(0), C = u.dim(1), W = w.dim(1);
    HYMOE_CHECK(w.dim(0) == C && tail.numel() == (W - 1) * C && y.numel() == T * C,
                "causal_conv: u ",
                shape_string(u.shape),
                " w ",
                shape_string(w.shape),
                " tail ",
                shape_string(tail.shape));
    const float* up = u.ptr<float>();
    const float* wp = w.ptr<float>();
    float* tp = tail.ptr<float>();
    float* yp = y.ptr<float>();
    // input row j of the extended sequence [tail; u]: j < W−1 from the tail, else u[j − (W−1)]
    auto in = [&](int64_t j) { return j < W - 1 ? tp + j * C : up + (j - (W - 1)) * C; };
    for (int64_t t = 0; t < T; ++t) {
        float* yt = yp + t * C;
        std::fill(yt, yt + C, 0.0f);
        for (int64_t i = 0; i < W; ++i) {
            const float* ui = in(t + i);  // u_{t−W+1+i} sits at extended row t + i
            for (int64_t c = 0; c < C; ++c)
                yt[c] += wp[c * W + i] * ui[c];
        }
    }
    // new tail: the last W−1 rows of [tail; u]
    std::vector<float> last(static_cast<size_t>((W - 1) * C));
    for (int64_t j = 0; j < W - 1; ++j)
        std::copy(in(T + j), in(T + j) + C, last.begin() + j * C);
    std::copy(last.begin(), last.end(), tp);
}

}  // namespace hymoe::ops
