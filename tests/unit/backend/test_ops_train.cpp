// The backward ops and AdamW of backend/ops_backward.h beside the finite-difference suite
// (test_ops_backward.cpp): the MLP activations' backward (SwiGLU, ReLU²), the sigmoid gate's and
// the AdamW update against plain double-precision references written here, and every op on a CPU
// Ctx bit-identical to its CPU form (RMSNorm, linear, softmax and RoPE backward too; RoPE's on
// strided heads against the pointer form). The same ops on a CUDA context against these are
// tests/cuda/test_backward_ops.cpp.
#include <cmath>
#include <cstring>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "hymoe/backend/ops.h"
#include "hymoe/backend/ops_backward.h"
#include "hymoe/core/rng.h"

using namespace hymoe;

namespace {

Buffer random(Shape shape, uint32_t stream, float mean = 0.0f) {
    Buffer b(DType::f32, std::move(shape));
    Philox rng(11, stream, 0);
    rng.fill_normal(b.ptr<float>(), static_cast<size_t>(b.view().numel()), mean, 1.0f);
    return b;
}

Buffer copy_of(const Buffer& b) {
    Buffer c(b.view().dtype, b.view().shape);
    std::memcpy(c.view().data, b.view().data, b.view().bytes());
    return c;
}

bool same_bits(const Buffer& a, const Buffer& b) {
    return a.view().bytes() == b.view().bytes() &&
           std::memcmp(a.view().data, b.view().data, a.view().bytes()) == 0;
}

double f64(float v) {
    return static_cast<double>(v);
}

double sigmoid_d(double x) {
    return 1.0 / (1.0 + std::exp(-x));
}

// max |a − ref| / max(1, |ref|)
double rel_err(const Buffer& a, const std::vector<double>& ref) {
    double e = 0;
    for (size_t i = 0; i < ref.size(); ++i)
        e = std::max(e,
                     std::abs(f64(a.ptr<float>()[i]) - ref[i]) / std::max(1.0, std::abs(ref[i])));
    return e;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(ops_train)

// h = SiLU(g) ⊙ u: ∂h/∂g = u σ(g)(1 + g(1 − σ(g))), ∂h/∂u = SiLU(g); ReLU²: 2·ReLU(u).
BOOST_AUTO_TEST_CASE(mlp_activation_backward_against_formulas) {
    const Buffer g0 = random({7, 19}, 1), u0 = random({7, 19}, 2), dh = random({7, 19}, 3);
    Buffer g = copy_of(g0), u = copy_of(u0), r = copy_of(u0);
    ops::swiglu_backward(g.view(), u.view(), dh.view());
    ops::relu2_backward(r.view(), dh.view());
    std::vector<double> dg, du, dr;
    for (int64_t i = 0; i < g.view().numel(); ++i) {
        const double gi = f64(g0.ptr<float>()[i]), ui = f64(u0.ptr<float>()[i]);
        const double d = f64(dh.ptr<float>()[i]), s = sigmoid_d(gi);
        dg.push_back(d * ui * s * (1 + gi * (1 - s)));
        du.push_back(d * gi * s);
        dr.push_back(d * 2 * std::max(ui, 0.0));
    }
    BOOST_TEST(rel_err(g, dg) <= 1e-6);
    BOOST_TEST(rel_err(u, du) <= 1e-6);
    BOOST_TEST(rel_err(r, dr) <= 6e-8);  // one rounding (the doubling is exact)
}

// u = o ⊙ g: dz = du ⊙ o ⊙ g(1 − g), do = du ⊙ g.
BOOST_AUTO_TEST_CASE(sigmoid_gate_backward_against_formula) {
    const Buffer du0 = random({4, 33}, 4), o = random({4, 33}, 5);
    Buffer g = random({4, 33}, 6);
    ops::sigmoid_inplace(g.view());
    Buffer du = copy_of(du0), dz(DType::f32, {4, 33});
    ops::sigmoid_gate_backward(du.view(), o.view(), g.view(), dz.view());
    std::vector<double> d_o, d_z;
    for (int64_t i = 0; i < du.view().numel(); ++i) {
        const double d = f64(du0.ptr<float>()[i]), gi = f64(g.ptr<float>()[i]);
        d_o.push_back(d * gi);
        d_z.push_back(d * f64(o.ptr<float>()[i]) * gi * (1 - gi));
    }
    BOOST_TEST(rel_err(du, d_o) <= 1e-6);
    BOOST_TEST(rel_err(dz, d_z) <= 1e-6);
}

// Three AdamW updates (warm moments, clipping scale, weight decay) against torch.optim.AdamW's
// formula in double.
BOOST_AUTO_TEST_CASE(adamw_against_the_formula) {
    const int64_t n = 50;
    Buffer p = random({n}, 7), m(DType::f32, {n}), v(DType::f32, {n});
    std::vector<double> rp(p.ptr<float>(), p.ptr<float>() + n), rm(n, 0.0), rv(n, 0.0);
    ops::AdamWStep s;
    s.beta1 = 0.9, s.beta2 = 0.95, s.eps = 1e-8, s.weight_decay = 0.01, s.grad_scale = 0.5;
    for (int t = 1; t <= 3; ++t) {
        const Buffer g = random({n}, 10 + t);
        s.lr = 1e-2 * t;
        s.c1 = 1 - std::pow(s.beta1, t);
        s.c2 = 1 - std::pow(s.beta2, t);
        ops::adamw(p.view(), g.view(), m.view(), v.view(), s);
        for (int64_t k = 0; k < n; ++k) {
            const double gk = s.grad_scale * f64(g.ptr<float>()[k]);
            rm[k] = s.beta1 * rm[k] + (1 - s.beta1) * gk;
            rv[k] = s.beta2 * rv[k] + (1 - s.beta2) * gk * gk;
            rp[k] = rp[k] * (1 - s.lr * s.weight_decay) -
                    s.lr * (rm[k] / s.c1) / (std::sqrt(rv[k] / s.c2) + s.eps);
        }
    }
    BOOST_TEST(rel_err(p, rp) <= 1e-6);
    BOOST_TEST(rel_err(m, rm) <= 1e-6);
    BOOST_TEST(rel_err(v, rv) <= 1e-6);
}

BOOST_AUTO_TEST_CASE(cpu_context_is_the_cpu_op_bit_for_bit) {
    const backend::Ctx ctx = backend::cpu_ctx();
    const Buffer x = random({6, 20}, 20), w = random({20}, 21), dy = random({6, 20}, 22);
    Buffer a(DType::f32, {6, 20}), b(DType::f32, {6, 20});
    ops::rms_norm_backward(x.view(), w.view(), 1e-6f, dy.view(), a.view());
    ops::rms_norm_backward(ctx, x.view(), w.view(), 1e-6f, dy.view(), b.view());
    BOOST_TEST(same_bits(a, b));

    const Buffer wl = random({20, 9}, 23);
    Buffer la = random({6, 9}, 24), lb = copy_of(la);
    ops::linear_backward(dy.view(), wl.view(), la.view(), 1.0f);
    ops::linear_backward(ctx, dy.view(), wl.view(), lb.view(), 1.0f);
    BOOST_TEST(same_bits(la, lb));

    Buffer p = random({6, 20}, 25);
    p.ptr<float>()[3] = -INFINITY;  // a masked entry
    ops::softmax_rows(p.ptr<float>(), 6, 20);
    Buffer sa = copy_of(dy), sb = copy_of(dy);
    ops::softmax_rows_backward(p.ptr<float>(), sa.ptr<float>(), 6, 20);
    ops::softmax_rows_backward(ctx, p.view(), sb.view());
    BOOST_TEST(same_bits(sa, sb));

    // RoPE backward on 2 heads of 8 at column 2 of rows of 20 (the MLA q layout), interleaved.
    const ops::RopeFreqs freqs = ops::rope_freqs(4, 10000.0);
    const std::vector<int64_t> pos{0, 1, 2, 7, 8, 30};
    Buffer pos_t(DType::i64, {6});
    std::memcpy(pos_t.view().data, pos.data(), 6 * sizeof(int64_t));
    Buffer ra = copy_of(dy), rb = copy_of(dy);
    ops::rope_backward(ra.ptr<float>() + 2, 6, 2, 20, 8, pos.data(), freqs, true);
    Tensor rbv = rb.view();
    ops::rope_backward(ctx, rbv, 2, 2, 8, pos_t.view(), freqs, true);
    BOOST_TEST(same_bits(ra, rb));

    Buffer g1 = random({6, 20}, 26), u1 = random({6, 20}, 27);
    Buffer g2 = copy_of(g1), u2 = copy_of(u1), r1 = copy_of(u1), r2 = copy_of(u1);
    ops::swiglu_backward(g1.view(), u1.view(), dy.view());
    ops::swiglu_backward(ctx, g2.view(), u2.view(), dy.view());
    ops::relu2_backward(r1.view(), dy.view());
    ops::relu2_backward(ctx, r2.view(), dy.view());
    BOOST_TEST((same_bits(g1, g2) && same_bits(u1, u2) && same_bits(r1, r2)));

    Buffer d1 = copy_of(dy), d2 = copy_of(dy), z1(DType::f32, {6, 20}), z2(DType::f32, {6, 20});
    ops::sigmoid_gate_backward(d1.view(), x.view(), p.view(), z1.view());
    ops::sigmoid_gate_backward(ctx, d2.view(), x.view(), p.view(), z2.view());
    BOOST_TEST((same_bits(d1, d2) && same_bits(z1, z2)));

    Buffer p1 = random({6, 20}, 28), m1 = random({6, 20}, 29), v1 = copy_of(p);
    Buffer p2 = copy_of(p1), m2 = copy_of(m1), v2 = copy_of(v1);
    ops::AdamWStep s;
    s.lr = 1e-3, s.weight_decay = 0.1, s.c1 = 0.1, s.c2 = 0.001;
    ops::adamw(p1.view(), dy.view(), m1.view(), v1.view(), s);
    ops::adamw(ctx, p2.view(), dy.view(), m2.view(), v2.view(), s);
    BOOST_TEST((same_bits(p1, p2) && same_bits(m1, m2) && same_bits(v1, v2)));
}

BOOST_AUTO_TEST_SUITE_END()
