// The router's score backward and the cross-entropy rows (backend/ops_router_loss.h) on the CPU
// against double-precision references written here: router_scores_backward under sigmoid and
// softmax scoring, renormalised (with ε and ρ, and a bias on the gathered scores) or not, the
// unchosen experts' entries 0 under sigmoid; cross_entropy_rows' losses, argmaxes (a tie goes to
// the first maximum) and gradient scale·(softmax − onehot); each op on the CPU Ctx bit-identical
// to its CPU form. The same ops on a CUDA context against these are
// tests/cuda/test_router_loss_ops.cpp.
#include <cmath>
#include <cstring>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "hymoe/backend/ops_router_loss.h"
#include "hymoe/core/rng.h"

using namespace hymoe;

namespace {

Buffer random(Shape shape, uint32_t stream, float scale = 1.0f) {
    Buffer b(DType::f32, std::move(shape));
    Philox(29, stream, 0)
        .fill_normal(b.ptr<float>(), static_cast<size_t>(b.view().numel()), 0.0f, scale);
    return b;
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

}  // namespace

BOOST_AUTO_TEST_SUITE(router_loss_ops)

BOOST_AUTO_TEST_CASE(router_scores_backward_matches_reference) {
    const int64_t n = 5, E = 8, k = 3;
    Buffer s = random({n, E}, 1);
    for (int64_t i = 0; i < n * E; ++i)  // scores in (0, 1)
        s.ptr<float>()[i] = 1.0f / (1.0f + std::exp(-s.ptr<float>()[i]));
    const Buffer dw = random({n, k}, 2), bias = random({E}, 3, 0.1f);
    std::vector<int64_t> idx = {0, 3, 5, 7, 1, 2, 4, 0, 6, 2, 5, 3, 1, 7, 0};
    const Tensor idx_t{idx.data(), DType::i64, Device::cpu, {n, k}};
    for (bool sig : {true, false})
        for (bool renorm : {true, false})
            for (bool biased : {false, true}) {
                const ops::RouterGradRule rule{renorm, renorm ? 1e-3f : 0.0f, 2.5f, sig};
                Buffer dl = random({n, E}, 4), dlc(DType::f32, {n, E});  // overwritten
                const Tensor b = biased ? bias.view() : Tensor{};
                ops::router_scores_backward(s.view(), idx_t, dw.view(), b, rule, dl.view());
                ops::router_scores_backward(
                    backend::cpu_ctx(), s.view(), idx_t, dw.view(), b, rule, dlc.view());
                BOOST_TEST(std::memcmp(dl.view().data, dlc.view().data, dl.view().bytes()) == 0);
                std::vector<double> ref(static_cast<size_t>(n * E), 0.0);
                for (int64_t t = 0; t < n; ++t) {
                    std::vector<double> u(k), du(k);
                    double z = 0, mean = 0;
                    for (int64_t i = 0; i < k; ++i) {
                        const int64_t e = idx[static_cast<size_t>(t * k + i)];
                        u[i] = at(s, t * E + e) + (biased ? at(bias, e) : 0.0);
                        z += u[i];
                    }
                    const double inv = 1.0 / (z + static_cast<double>(rule.eps));
                    for (int64_t i = 0; i < k; ++i)
                        mean += at(dw, t * k + i) * u[i] * inv;
                    for (int64_t i = 0; i < k; ++i)
                        du[i] =
                            2.5 * (renorm ? inv * (at(dw, t * k + i) - mean) : at(dw, t * k + i));
                    double c = 0;
                    for (int64_t i = 0; i < k; ++i)
                        c += du[i] * at(s, t * E + idx[static_cast<size_t>(t * k + i)]);
                    for (int64_t e = 0; e < E && !sig; ++e)
                        ref[static_cast<size_t>(t * E + e)] = -at(s, t * E + e) * c;
                    for (int64_t i = 0; i < k; ++i) {
                        const int64_t e = idx[static_cast<size_t>(t * k + i)];
                        const double se = at(s, t * E + e);
                        ref[static_cast<size_t>(t * E + e)] +=
                            sig ? du[i] * se * (1 - se) : se * du[i];
                    }
                }
                BOOST_TEST(rel_err(dl, ref) < 1e-5,
                           "sigmoid " << sig << " renorm " << renorm << " bias " << biased);
            }
}

BOOST_AUTO_TEST_CASE(cross_entropy_rows_match_reference) {
    const int64_t k = 4, V = 50;
    const double scale = 0.125;
    Buffer z = random({k, V}, 5, 3.0f);
    z.ptr<float>()[1 * V + 7] = 9.0f;  // row 1: a tie, the first maximum wins
    z.ptr<float>()[1 * V + 30] = 9.0f;
    std::vector<int64_t> target = {3, 7, 49, 0};
    const Tensor t{target.data(), DType::i64, Device::cpu, {k}};
    Buffer zc(DType::f32, {k, V});
    std::memcpy(zc.view().data, z.view().data, z.view().bytes());
    std::vector<double> loss(k), grad(static_cast<size_t>(k * V));
    std::vector<int64_t> best(k);
    for (int64_t r = 0; r < k; ++r) {
        double m = -INFINITY, sum = 0;
        for (int64_t v = 0; v < V; ++v)
            if (at(z, r * V + v) > m)
                m = at(z, r * V + v), best[static_cast<size_t>(r)] = v;
        for (int64_t v = 0; v < V; ++v)
            sum += std::exp(at(z, r * V + v) - m);
        loss[static_cast<size_t>(r)] =
            std::log(sum) + m - at(z, r * V + target[static_cast<size_t>(r)]);
        for (int64_t v = 0; v < V; ++v)
            grad[static_cast<size_t>(r * V + v)] = scale * (std::exp(at(z, r * V + v) - m) / sum -
                                                            (v == target[static_cast<size_t>(r)]));
    }
    const ops::CrossEntropyRows ce = ops::cross_entropy_rows(z.view(), t, scale);
    const ops::CrossEntropyRows cc =
        ops::cross_entropy_rows(backend::cpu_ctx(), zc.view(), t, scale);
    BOOST_TEST(best[1] == 7);
    for (int64_t r = 0; r < k; ++r) {
        BOOST_TEST(ce.best[static_cast<size_t>(r)] == best[static_cast<size_t>(r)]);
        BOOST_TEST(std::abs(ce.loss[static_cast<size_t>(r)] - loss[static_cast<size_t>(r)]) < 1e-6);
        BOOST_TEST(cc.best[static_cast<size_t>(r)] == ce.best[static_cast<size_t>(r)]);
        BOOST_TEST(cc.loss[static_cast<size_t>(r)] == ce.loss[static_cast<size_t>(r)]);
    }
    BOOST_TEST(rel_err(z, grad) < 1e-7);
    BOOST_TEST(std::memcmp(z.view().data, zc.view().data, z.view().bytes()) == 0);
}

BOOST_AUTO_TEST_SUITE_END()
