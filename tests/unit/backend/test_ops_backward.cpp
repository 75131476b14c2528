// Unit tests of the op backwards (hymoe/backend/ops_backward.h): RMSNorm's and the softmax's input
// gradients against central finite differences of a double-precision forward written here; the
// linear input gradient against loops; RoPE's backward as the transpose of ops::rope (⟨R a, b⟩ =
// ⟨a, Rᵀ b⟩, both pair layouts, with a YaRN-style cos/sin multiplier).
#include <cmath>
#include <functional>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "hymoe/backend/ops.h"
#include "hymoe/backend/ops_backward.h"
#include "hymoe/core/rng.h"

namespace ops = hymoe::ops;
using hymoe::Buffer;
using hymoe::DType;

namespace {

Buffer random(hymoe::Shape shape, uint32_t stream, float mean = 0.0f) {
    Buffer b(DType::f32, std::move(shape));
    hymoe::Philox rng(43, stream, 0);
    rng.fill_normal(b.ptr<float>(), static_cast<size_t>(b.view().numel()), mean, 1.0f);
    return b;
}

double f64(float v) {
    return static_cast<double>(v);
}

// ∂f/∂x_i by central differences in double, step h.
std::vector<double> fd_gradient(const std::function<double(const std::vector<double>&)>& f,
                                std::vector<double> x,
                                double h) {
    std::vector<double> g(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
        const double x0 = x[i];
        x[i] = x0 + h;
        const double up = f(x);
        x[i] = x0 - h;
        const double down = f(x);
        x[i] = x0;
        g[i] = (up - down) / (2 * h);
    }
    return g;
}

// max |a − b| / max |b|
double rel_err(const float* a, const std::vector<double>& b) {
    double e = 0, scale = 0;
    for (size_t i = 0; i < b.size(); ++i) {
        e = std::max(e, std::abs(f64(a[i]) - b[i]));
        scale = std::max(scale, std::abs(b[i]));
    }
    return e / scale;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(ops_backward)

// Σ dy ⊙ RMSNorm(x) in double, differentiated numerically, against rms_norm_backward (into its
// own buffer and in place over dy).
BOOST_AUTO_TEST_CASE(rms_norm_backward_matches_finite_differences) {
    const int64_t rows = 3, dim = 16;
    const float eps = 1e-5f;
    Buffer x = random({rows, dim}, 1, 0.3f), w = random({dim}, 2, 1.0f),
           dy = random({rows, dim}, 3);
    auto loss = [&](const std::vector<double>& xv) {
        double l = 0;
        for (int64_t r = 0; r < rows; ++r) {
            double ss = 0;
            for (int64_t i = 0; i < dim; ++i)
                ss += xv[r * dim + i] * xv[r * dim + i];
            const double inv = 1.0 / std::sqrt(ss / dim + f64(eps));
            for (int64_t i = 0; i < dim; ++i)
                l += f64(dy.ptr<float>()[r * dim + i]) * f64(w.ptr<float>()[i]) * xv[r * dim + i] *
                     inv;
        }
        return l;
    };
    const std::vector<double> fd =
        fd_gradient(loss, std::vector<double>(x.ptr<float>(), x.ptr<float>() + rows * dim), 1e-6);
    Buffer dx(DType::f32, {rows, dim});
    ops::rms_norm_backward(x.view(), w.view(), eps, dy.view(), dx.view());
    const double err = rel_err(dx.ptr<float>(), fd);
    BOOST_TEST(err <= 1e-5);
    ops::rms_norm_backward(x.view(), w.view(), eps, dy.view(), dy.view());  // dx aliasing dy
    BOOST_TEST(rel_err(dy.ptr<float>(), fd) == err);
    BOOST_TEST_MESSAGE("rms_norm_backward vs finite differences: relative error " << err);
}

// Σ dp ⊙ softmax(x) over rows with a masked (−inf) entry, against softmax_rows_backward.
BOOST_AUTO_TEST_CASE(softmax_backward_matches_finite_differences) {
    const int64_t rows = 3, n = 7;
    Buffer x = random({rows, n}, 4), dp = random({rows, n}, 5);
    x.ptr<float>()[n + 2] = -INFINITY;
    auto softmax = [&](const std::vector<double>& xv, int64_t r, std::vector<double>& p) {
        double mx = -INFINITY, sum = 0;
        for (int64_t i = 0; i < n; ++i)
            mx = std::max(mx, xv[r * n + i]);
        for (int64_t i = 0; i < n; ++i)
            sum += (p[i] = std::exp(xv[r * n + i] - mx));
        for (double& v : p)
            v /= sum;
    };
    auto loss = [&](const std::vector<double>& xv) {
        double l = 0;
        std::vector<double> p(n);
        for (int64_t r = 0; r < rows; ++r) {
            softmax(xv, r, p);
            for (int64_t i = 0; i < n; ++i)
                l += f64(dp.ptr<float>()[r * n + i]) * p[i];
        }
        return l;
    };
    std::vector<double> fd =
        fd_gradient(loss, std::vector<double>(x.ptr<float>(), x.ptr<float>() + rows * n), 1e-6);
    fd[n + 2] = 0.0;  // the masked entry: no gradient (FD of −inf ± h is undefined)
    Buffer p(DType::f32, {rows, n});
    std::copy_n(x.ptr<float>(), rows * n, p.ptr<float>());
    ops::softmax_rows(p.ptr<float>(), rows, n);
    ops::softmax_rows_backward(p.ptr<float>(), dp.ptr<float>(), rows, n);
    BOOST_TEST(dp.ptr<float>()[n + 2] == 0.0f);
    const double err = rel_err(dp.ptr<float>(), fd);
    BOOST_TEST(err <= 1e-5);
    BOOST_TEST_MESSAGE("softmax_rows_backward vs finite differences: relative error " << err);
}

// dx = dy · w by loops, then beta = 1 accumulates.
BOOST_AUTO_TEST_CASE(linear_backward_matches_loops) {
    const int64_t n = 5, in = 6, out = 4;
    Buffer dy = random({n, out}, 6), w = random({out, in}, 7), dx = random({n, in}, 8);
    std::vector<double> want(static_cast<size_t>(n * in));
    for (int64_t t = 0; t < n; ++t)
        for (int64_t i = 0; i < in; ++i)
            for (int64_t o = 0; o < out; ++o)
                want[t * in + i] +=
                    f64(dy.ptr<float>()[t * out + o]) * f64(w.ptr<float>()[o * in + i]);
    ops::linear_backward(dy.view(), w.view(), dx.view());
    BOOST_TEST(rel_err(dx.ptr<float>(), want) <= 1e-6);
    for (double& v : want)
        v *= 2;
    ops::linear_backward(dy.view(), w.view(), dx.view(), 1.0f);
    BOOST_TEST(rel_err(dx.ptr<float>(), want) <= 1e-6);
}

// ⟨rope(a), b⟩ = ⟨a, rope_backward(b)⟩ for 3 tokens at positions (0, 5, 17), 2 heads of 6 with 4
// rotated dims (the other 2 untouched), mscale 1.3, both pair layouts; and rope_backward undoes
// rope up to mscale².
BOOST_AUTO_TEST_CASE(rope_backward_is_the_transpose) {
    const int64_t n_tok = 3, n_head = 2, head = 6;
    const int64_t pos[n_tok] = {0, 5, 17};
    ops::RopeFreqs freqs = ops::rope_freqs(4, 100.0);
    freqs.mscale = 1.3f;
    for (bool interleaved : {true, false}) {
        Buffer a = random({n_tok, n_head * head}, 9), b = random({n_tok, n_head * head}, 10);
        Buffer ra(DType::f32, {n_tok, n_head * head}), rb(DType::f32, {n_tok, n_head * head});
        std::copy_n(a.ptr<float>(), a.view().numel(), ra.ptr<float>());
        std::copy_n(b.ptr<float>(), b.view().numel(), rb.ptr<float>());
        ops::rope(ra.ptr<float>(), n_tok, n_head, n_head * head, head, pos, freqs, interleaved);
        ops::rope_backward(
            rb.ptr<float>(), n_tok, n_head, n_head * head, head, pos, freqs, interleaved);
        double lhs = 0, rhs = 0;
        for (int64_t i = 0; i < a.view().numel(); ++i) {
            lhs += f64(ra.ptr<float>()[i]) * f64(b.ptr<float>()[i]);
            rhs += f64(a.ptr<float>()[i]) * f64(rb.ptr<float>()[i]);
        }
        BOOST_TEST_CONTEXT("interleaved " << interleaved) {
            BOOST_TEST(std::abs(lhs - rhs) <= 1e-5 * std::abs(lhs));
            ops::rope_backward(
                ra.ptr<float>(), n_tok, n_head, n_head * head, head, pos, freqs, interleaved);
            double err = 0;
            for (int64_t t = 0; t < n_tok; ++t)
                for (int64_t e = 0; e < n_head * head; ++e) {
                    const bool rotated = e % head < 4;
                    const double scale = rotated ? 1.3 * 1.3 : 1.0;
                    const int64_t i = t * n_head * head + e;
                    err = std::max(
                        err, std::abs(f64(ra.ptr<float>()[i]) - scale * f64(a.ptr<float>()[i])));
                }
            BOOST_TEST(err <= 1e-5);
        }
    }
}

BOOST_AUTO_TEST_SUITE_END()
