// The KDA backward's pieces (backend/ops_kda_backward.h) on the CPU against references written
// here in double precision: kda_silu_l2 (q's l2 + scale, v's SiLU only) and the decay gate with
// its derivative (both gate forms) against their formulas; kda_silu_l2_backward and
// kda_gated_norm_backward against central differences of double-precision forwards;
// causal_conv_backward as the adjoint of ops::causal_conv over two packed sequences
// (⟨dc, conv(u)⟩ = ⟨du, u⟩); sigmoid_backward by its formula; and each op on the CPU Ctx
// bit-identical to its CPU form; the scans' argument checks, forward and backward (an empty
// sequence is nothing to do; no state, no chunk or a missing array is refused). The same ops on a
// CUDA context against these are tests/cuda/test_kda_backward_ops.cpp.
#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "hymoe/backend/ops.h"
#include "hymoe/backend/ops_kda_backward.h"
#include "hymoe/core/error.h"
#include "hymoe/core/rng.h"

using namespace hymoe;

namespace {

Buffer random(Shape shape, uint32_t stream, float scale = 1.0f) {
    Buffer b(DType::f32, std::move(shape));
    Philox(23, stream, 0)
        .fill_normal(b.ptr<float>(), static_cast<size_t>(b.view().numel()), 0.0f, scale);
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

double at(const Buffer& b, int64_t i) {
    return static_cast<double>(b.ptr<float>()[i]);
}

// max |a − ref| / max(1, |ref|)
double rel_err(const Buffer& a, const std::vector<double>& ref) {
    double e = 0;
    for (size_t i = 0; i < ref.size(); ++i)
        e = std::max(
            e, std::abs(at(a, static_cast<int64_t>(i)) - ref[i]) / std::max(1.0, std::abs(ref[i])));
    return e;
}

double sigmoid_d(double x) {
    return 1.0 / (1.0 + std::exp(-x));
}

// ∂f/∂v_i by central differences in double, v perturbed in place.
std::vector<double> central(std::vector<double>& v, const std::function<double()>& f) {
    std::vector<double> d(v.size());
    const double h = 1e-6;
    for (size_t i = 0; i < v.size(); ++i) {
        const double keep = v[i];
        v[i] = keep + h;
        const double up = f();
        v[i] = keep - h;
        d[i] = (up - f()) / (2 * h);
        v[i] = keep;
    }
    return d;
}

std::vector<double> widen(const Buffer& b) {
    std::vector<double> v(static_cast<size_t>(b.view().numel()));
    for (size_t i = 0; i < v.size(); ++i)
        v[i] = at(b, static_cast<int64_t>(i));
    return v;
}

// y = SiLU(c) per head of K, l2-normalised and scaled when l2 (double).
std::vector<double> silu_l2_ref(const std::vector<double>& c, int64_t K, bool l2, double scale) {
    std::vector<double> y(c.size());
    for (size_t i = 0; i < c.size(); ++i)
        y[i] = c[i] * sigmoid_d(c[i]);
    if (l2)
        for (size_t r = 0; r < c.size(); r += static_cast<size_t>(K)) {
            double ss = 0;
            for (int64_t i = 0; i < K; ++i)
                ss += y[r + static_cast<size_t>(i)] * y[r + static_cast<size_t>(i)];
            for (int64_t i = 0; i < K; ++i)
                y[r + static_cast<size_t>(i)] *= scale / std::sqrt(ss + 1e-6);
        }
    return y;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(kda_backward_ops)

BOOST_AUTO_TEST_CASE(silu_l2_and_its_backward) {
    const int64_t n = 5, K = 8, D = 3 * K;
    const backend::Ctx cpu = backend::cpu_ctx();
    const Buffer c = random({n, D}, 1), dy = random({n, D}, 2);
    for (bool l2 : {true, false}) {
        const float scale = l2 ? 0.35f : 1.0f;
        Buffer y(DType::f32, {n, D}), yc(DType::f32, {n, D});
        ops::kda_silu_l2(c.view(), K, l2, scale, y.view());
        ops::kda_silu_l2(cpu, c.view(), K, l2, scale, yc.view());
        BOOST_TEST(same_bits(y, yc));
        BOOST_TEST(rel_err(y, silu_l2_ref(widen(c), K, l2, scale)) < 1e-6);

        Buffer g = copy_of(dy), gc = copy_of(dy);
        ops::kda_silu_l2_backward(c.view(), K, l2, scale, g.view());
        ops::kda_silu_l2_backward(cpu, c.view(), K, l2, scale, gc.view());
        BOOST_TEST(same_bits(g, gc));
        std::vector<double> cv = widen(c);
        const std::vector<double> dyv = widen(dy);
        const std::vector<double> fd = central(cv, [&] {
            const std::vector<double> yv = silu_l2_ref(cv, K, l2, scale);
            double l = 0;
            for (size_t i = 0; i < yv.size(); ++i)
                l += dyv[i] * yv[i];
            return l;
        });
        const double err = rel_err(g, fd);
        BOOST_TEST_MESSAGE("kda_silu_l2_backward l2=" << l2 << " vs FD " << err);
        BOOST_TEST(err < 1e-5);
    }
}

BOOST_AUTO_TEST_CASE(decay_gate_with_derivative) {
    const int64_t n = 4, H = 2, K = 6, D = H * K;
    const backend::Ctx cpu = backend::cpu_ctx();
    Buffer f = random({n, D}, 3, 4.0f), a_log = random({H}, 4, 0.5f), bias = random({D}, 5);
    f.ptr<float>()[0] = 30.0f;  // softplus's identity branch
    for (std::optional<float> lb : {std::optional<float>{}, std::optional<float>{-5.0f}}) {
        Buffer g = copy_of(f), dz(DType::f32, {n, D}), gc = copy_of(f), dzc(DType::f32, {n, D});
        ops::kda_decay_gate_grad(g.view(), a_log.view(), bias.view(), lb, dz.view());
        ops::kda_decay_gate_grad(cpu, gc.view(), a_log.view(), bias.view(), lb, dzc.view());
        BOOST_TEST(same_bits(g, gc));
        BOOST_TEST(same_bits(dz, dzc));
        std::vector<double> rg(static_cast<size_t>(n * D)), rdz(rg.size());
        for (int64_t t = 0; t < n; ++t)
            for (int64_t i = 0; i < D; ++i) {
                const double a = std::exp(at(a_log, i / K)), z = at(f, t * D + i) + at(bias, i);
                const size_t j = static_cast<size_t>(t * D + i);
                if (lb) {
                    const double s = sigmoid_d(a * z), l = static_cast<double>(*lb);
                    rg[j] = l * s;
                    rdz[j] = l * a * s * (1 - s);
                } else {
                    rg[j] = -a * (z > 20 ? z : std::log1p(std::exp(z)));
                    rdz[j] = -a * sigmoid_d(z);
                }
            }
        BOOST_TEST(rel_err(g, rg) < 1e-6);
        BOOST_TEST(rel_err(dz, rdz) < 1e-6);
    }
}

// on = RMSNorm(o; w) ⊙ σ(z) per head: dO and d(z) against central differences.
BOOST_AUTO_TEST_CASE(gated_norm_backward) {
    const int64_t n = 3, K = 8, D = 2 * K;
    const float eps = 1e-5f;
    const backend::Ctx cpu = backend::cpu_ctx();
    const Buffer o = random({n, D}, 6), w = random({K}, 7), z = random({n, D}, 8),
                 don = random({n, D}, 9);
    Buffer nrm(DType::f32, {n, D}), gate = copy_of(z);
    ops::sigmoid_inplace(gate.view());
    const Tensor heads{o.view().data, DType::f32, Device::cpu, {n * D / K, K}};
    Tensor nrm_heads{nrm.view().data, DType::f32, Device::cpu, {n * D / K, K}};
    ops::rms_norm(heads, w.view(), eps, nrm_heads);
    Buffer dO(DType::f32, {n, D}), dg(DType::f32, {n, D}), dOc(DType::f32, {n, D}),
        dgc(DType::f32, {n, D});
    ops::kda_gated_norm_backward(
        o.view(), nrm.view(), gate.view(), w.view(), eps, don.view(), dO.view(), dg.view());
    ops::kda_gated_norm_backward(
        cpu, o.view(), nrm.view(), gate.view(), w.view(), eps, don.view(), dOc.view(), dgc.view());
    BOOST_TEST(same_bits(dO, dOc));
    BOOST_TEST(same_bits(dg, dgc));
    std::vector<double> ov = widen(o), zv = widen(z);
    const std::vector<double> donv = widen(don);
    auto loss = [&] {
        double l = 0;
        for (int64_t r = 0; r < n * D / K; ++r) {
            double ss = 0;
            for (int64_t i = 0; i < K; ++i)
                ss += ov[static_cast<size_t>(r * K + i)] * ov[static_cast<size_t>(r * K + i)];
            const double inv = 1.0 / std::sqrt(ss / K + static_cast<double>(eps));
            for (int64_t i = 0; i < K; ++i) {
                const size_t j = static_cast<size_t>(r * K + i);
                l += donv[j] * ov[j] * inv * at(w, i) * sigmoid_d(zv[j]);
            }
        }
        return l;
    };
    const std::vector<double> fd_o = central(ov, loss), fd_z = central(zv, loss);
    BOOST_TEST_MESSAGE("kda_gated_norm_backward dO " << rel_err(dO, fd_o) << " dz "
                                                     << rel_err(dg, fd_z));
    BOOST_TEST(rel_err(dO, fd_o) < 1e-5);
    BOOST_TEST(rel_err(dg, fd_z) < 1e-5);
}

// Two sequences of 5 and 3 rows (W = 4 reaches past the second's start): the backward is the
// forward's adjoint, ⟨dc, conv(u)⟩ = ⟨du, u⟩, for every u.
BOOST_AUTO_TEST_CASE(causal_conv_backward_is_the_adjoint) {
    const int64_t C = 6, W = 4, n = 8;
    const std::vector<int64_t> offsets{0, 5, 8};
    ops::KdaSeqTable t;
    t.n_tok = n;
    t.n_seq = 2;
    t.offsets = offsets.data();
    const Buffer w = random({C, 1, W}, 10), dc = random({n, C}, 11);
    Buffer du(DType::f32, {n, C}), duc(DType::f32, {n, C});
    ops::causal_conv_backward(t, dc.view(), w.view(), du.view());
    ops::causal_conv_backward(backend::cpu_ctx(), t, dc.view(), w.view(), duc.view());
    BOOST_TEST(same_bits(du, duc));
    const Tensor w2{w.view().data, DType::f32, Device::cpu, {C, W}};
    for (uint32_t trial = 0; trial < 3; ++trial) {
        const Buffer u = random({n, C}, 20 + trial);
        Buffer y(DType::f32, {n, C});
        for (int64_t s = 0; s < 2; ++s) {
            Buffer tail(DType::f32, {W - 1, C});
            Tensor tv = tail.view(), ys = y.view().rows(offsets[s], offsets[s + 1] - offsets[s]);
            ops::causal_conv(u.view().rows(offsets[s], offsets[s + 1] - offsets[s]), w2, tv, ys);
        }
        double lhs = 0, rhs = 0;
        for (int64_t i = 0; i < n * C; ++i) {
            lhs += at(dc, i) * at(y, i);
            rhs += at(du, i) * at(u, i);
        }
        BOOST_TEST(std::abs(lhs - rhs) < 1e-5 * std::max(1.0, std::abs(lhs)));
    }
}

BOOST_AUTO_TEST_CASE(sigmoid_backward_formula) {
    Buffer s = random({7, 5}, 12), d = random({7, 5}, 13);
    ops::sigmoid_inplace(s.view());
    Buffer dc = copy_of(d);
    std::vector<double> ref(35);
    for (int64_t i = 0; i < 35; ++i)
        ref[static_cast<size_t>(i)] = at(d, i) * at(s, i) * (1 - at(s, i));
    ops::sigmoid_backward(s.view(), d.view());
    ops::sigmoid_backward(backend::cpu_ctx(), s.view(), dc.view());
    BOOST_TEST(same_bits(d, dc));
    BOOST_TEST(rel_err(d, ref) < 1e-6);
}

BOOST_AUTO_TEST_CASE(scans_check_their_arguments) {
    ops::KdaScanParams f;  // the forwards: a state is needed, and the arrays once T > 0
    f.n_head = 1, f.d_k = 2, f.d_v = 2;
    BOOST_CHECK_THROW(ops::kda_recurrent(f), Error);
    std::vector<float> S(4, 0.0f);
    f.S = S.data();
    BOOST_CHECK_NO_THROW(ops::kda_recurrent(f));
    BOOST_CHECK_NO_THROW(ops::kda_chunked(f, 16));
    f.n_tok = 3;
    BOOST_CHECK_THROW(ops::kda_recurrent(f), Error);
    BOOST_CHECK_THROW(ops::kda_chunked(f, 16), Error);
    using Backward =
        void (*)(const ops::KdaScanParams&, const float*, const ops::KdaScanGrads&, int);
    for (Backward backward :
         {Backward{&ops::kda_scan_backward}, Backward{&ops::kda_scan_backward_tokens}}) {
        ops::KdaScanParams p;
        p.n_head = 1, p.d_k = 2, p.d_v = 2;
        const ops::KdaScanGrads none;
        BOOST_CHECK_NO_THROW(backward(p, nullptr, none, 16));     // T = 0: nothing to do
        BOOST_CHECK_THROW(backward(p, nullptr, none, 0), Error);  // no chunk
        p.n_tok = 3;
        BOOST_CHECK_THROW(backward(p, nullptr, none, 16), Error);  // arrays missing
    }
}

BOOST_AUTO_TEST_SUITE_END()
