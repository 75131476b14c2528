// CPU ops against hand-computed values and naive loops: GEMM (every transpose, the one-row GEMV
// path), RMSNorm, LayerNorm, l2norm, softmax with masked entries, softplus, RoPE in both pair
// layouts, YaRN, top-k ties, and the causal conv continuing across calls through its tail; host
// Buffers zero-filled by default and left unfilled under the uninit tag, both counted.
#include <cmath>
#include <cstdint>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "hymoe/backend/ops.h"
#include "hymoe/core/rng.h"

namespace ops = hymoe::ops;
using hymoe::Buffer;
using hymoe::DType;

namespace {

Buffer filled(hymoe::Shape shape, std::vector<float> values) {
    Buffer b(DType::f32, std::move(shape));
    std::copy(values.begin(), values.end(), b.ptr<float>());
    return b;
}

Buffer random(hymoe::Shape shape, uint32_t stream) {
    Buffer b(DType::f32, std::move(shape));
    hymoe::Philox rng(42, stream, 0);
    rng.fill_normal(b.ptr<float>(), static_cast<size_t>(b.view().numel()), 0.0f, 1.0f);
    return b;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(ops_cpu)

BOOST_AUTO_TEST_CASE(gemm_every_transpose_and_gemv_match_loops) {
    const int64_t m = 5, n = 7, k = 3;
    for (int64_t rows : {m, int64_t{1}}) {
        for (bool ta : {false, true}) {
            for (bool tb : {false, true}) {
                Buffer a = random({ta ? k : rows, ta ? rows : k}, 1);
                Buffer b = random({tb ? n : k, tb ? k : n}, 2);
                Buffer c = random({rows, n}, 3);
                std::vector<float> expect(c.ptr<float>(), c.ptr<float>() + rows * n);
                for (int64_t i = 0; i < rows; ++i)
                    for (int64_t j = 0; j < n; ++j) {
                        double s = 0;
                        for (int64_t p = 0; p < k; ++p)
                            s += static_cast<double>(ta ? a.ptr<float>()[p * rows + i]
                                                        : a.ptr<float>()[i * k + p]) *
                                 static_cast<double>(tb ? b.ptr<float>()[j * k + p]
                                                        : b.ptr<float>()[p * n + j]);
                        expect[i * n + j] = static_cast<float>(2 * s) + 0.5f * expect[i * n + j];
                    }
                ops::gemm(ta,
                          tb,
                          rows,
                          n,
                          k,
                          2.0f,
                          a.ptr<float>(),
                          ta ? rows : k,
                          b.ptr<float>(),
                          tb ? k : n,
                          0.5f,
                          c.ptr<float>(),
                          n);
                for (int64_t i = 0; i < rows * n; ++i)
                    BOOST_TEST(c.ptr<float>()[i] == expect[i], boost::test_tools::tolerance(1e-5f));
            }
        }
    }
}

BOOST_AUTO_TEST_CASE(linear_is_x_times_w_transposed) {
    Buffer x = filled({2, 3}, {1, 2, 3, 4, 5, 6});
    Buffer w = filled({2, 3}, {1, 0, -1, 0.5f, 0.5f, 0.5f});
    Buffer y(DType::f32, {2, 2});
    ops::linear(x.view(), w.view(), y.view());
    std::vector<float> got(y.ptr<float>(), y.ptr<float>() + 4);
    BOOST_TEST(got == (std::vector<float>{-2, 3, -2, 7.5f}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(norms_by_hand) {
    Buffer x = filled({1, 4}, {1, 2, 3, 4});
    Buffer w = filled({4}, {1, 1, 2, 0.5f});
    Buffer y(DType::f32, {1, 4});
    ops::rms_norm(x.view(), w.view(), 0.0f, y.view());  // mean x² = 7.5
    const float r = 1.0f / std::sqrt(7.5f);
    BOOST_TEST(y.ptr<float>()[2] == 6 * r, boost::test_tools::tolerance(1e-6f));
    BOOST_TEST(y.ptr<float>()[3] == 2 * r, boost::test_tools::tolerance(1e-6f));
    Buffer b = filled({4}, {0, 0, 0, 1});
    ops::layer_norm(x.view(), w.view(), b.view(), 0.0f, y.view());  // mean 2.5, var 1.25
    BOOST_TEST(y.ptr<float>()[0] == -1.5f / std::sqrt(1.25f), boost::test_tools::tolerance(1e-6f));
    BOOST_TEST(y.ptr<float>()[3] == 0.75f / std::sqrt(1.25f) + 1,
               boost::test_tools::tolerance(1e-6f));
    std::vector<float> v = {3, 4};
    ops::l2_norm_rows(v.data(), 1, 2, 0.0f);
    BOOST_TEST(v == (std::vector<float>{0.6f, 0.8f}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(softmax_masks_and_softplus_threshold) {
    std::vector<float> s = {0, std::log(3.0f), -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    ops::softmax_rows(s.data(), 2, 3);
    BOOST_TEST(s[0] == 0.25f, boost::test_tools::tolerance(1e-6f));
    BOOST_TEST(s[1] == 0.75f, boost::test_tools::tolerance(1e-6f));
    BOOST_TEST(s[2] == 0.0f);
    BOOST_TEST((s[3] == 0.0f && s[4] == 0.0f && s[5] == 0.0f));  // fully masked row
    BOOST_TEST(ops::softplus(30.0f) == 30.0f);
    BOOST_TEST(ops::softplus(0.0f) == std::log(2.0f), boost::test_tools::tolerance(1e-6f));
}

BOOST_AUTO_TEST_CASE(rope_pairs_by_hand) {
    ops::RopeFreqs f = ops::rope_freqs(4, 100.0);  // θ = (1, 0.1)
    BOOST_TEST(f.theta[1] == 0.1f, boost::test_tools::tolerance(1e-6f));
    int64_t pos = 2;
    std::vector<float> v = {1, 0, 0, 1};
    ops::rope(v.data(), 1, 1, 4, 4, &pos, f, true);  // pairs (v0, v1) by 2 rad, (v2, v3) by 0.2
    BOOST_TEST(v[0] == std::cos(2.0f), boost::test_tools::tolerance(1e-6f));
    BOOST_TEST(v[1] == std::sin(2.0f), boost::test_tools::tolerance(1e-6f));
    BOOST_TEST(v[2] == -std::sin(0.2f), boost::test_tools::tolerance(1e-6f));
    BOOST_TEST(v[3] == std::cos(0.2f), boost::test_tools::tolerance(1e-6f));
    std::vector<float> h = {1, 0, 0, 1};
    ops::rope(h.data(), 1, 1, 4, 4, &pos, f, false);  // pairs (h0, h2) by 2 rad, (h1, h3) by 0.2
    BOOST_TEST(h[0] == std::cos(2.0f), boost::test_tools::tolerance(1e-6f));
    BOOST_TEST(h[2] == std::sin(2.0f), boost::test_tools::tolerance(1e-6f));
    BOOST_TEST(h[1] == -std::sin(0.2f), boost::test_tools::tolerance(1e-6f));
    BOOST_TEST(h[3] == std::cos(0.2f), boost::test_tools::tolerance(1e-6f));
}

BOOST_AUTO_TEST_CASE(yarn_keeps_high_frequencies_and_divides_low_ones) {
    // DeepSeek-V3.2: d_r 64, base 1e4, factor 40, original 4096, β 32 / 1
    ops::RopeFreqs plain = ops::rope_freqs(64, 1e4);
    ops::RopeFreqs yarn = ops::rope_freqs_yarn(64, 1e4, 40, 4096, 32, 1);
    const double pi = std::acos(-1.0);
    auto dim = [&](double rot) {
        return 64 * std::log(4096 / (rot * 2 * pi)) / (2 * std::log(1e4));
    };
    const int low = static_cast<int>(std::floor(dim(32))),
              high = static_cast<int>(std::ceil(dim(1)));
    BOOST_TEST(low == 10);
    BOOST_TEST(high == 23);
    BOOST_TEST(yarn.theta[low] == plain.theta[low]);
    BOOST_TEST(yarn.theta[31] == plain.theta[31] / 40, boost::test_tools::tolerance(1e-6f));
    const int mid = 16;  // ramp (16 − 10) / 13
    const double ramp = 6.0 / 13.0, theta = plain.theta[mid];
    BOOST_TEST(yarn.theta[mid] == static_cast<float>(theta / 40.0 * ramp + theta * (1 - ramp)),
               boost::test_tools::tolerance(1e-6f));
}

BOOST_AUTO_TEST_CASE(top_k_breaks_ties_by_smaller_index) {
    std::vector<float> x = {0.5f, 2, 2, -1, 2, 0.5f};
    std::vector<int64_t> idx(4);
    ops::top_k(x.data(), 6, 4, idx.data());
    BOOST_TEST(idx == (std::vector<int64_t>{1, 2, 4, 0}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(causal_conv_by_hand_and_across_chunks) {
    // one channel, W = 3, w = (1, 10, 100): y_t = u_{t-2} + 10 u_{t-1} + 100 u_t
    Buffer u = filled({4, 1}, {1, 2, 3, 4});
    Buffer w = filled({1, 3}, {1, 10, 100});
    Buffer tail(DType::f32, {2, 1});
    Buffer y(DType::f32, {4, 1});
    ops::causal_conv(u.view(), w.view(), tail.view(), y.view());
    std::vector<float> got(y.ptr<float>(), y.ptr<float>() + 4);
    BOOST_TEST(got == (std::vector<float>{100, 210, 321, 432}), boost::test_tools::per_element());
    BOOST_TEST((tail.ptr<float>()[0] == 3 && tail.ptr<float>()[1] == 4));
    // 3 channels, 7 steps: whole == 2 + 1 + 4 steps through the tail
    Buffer uu = random({7, 3}, 5), ww = random({3, 4}, 6);
    Buffer t_all(DType::f32, {3, 3}), y_all(DType::f32, {7, 3});
    ops::causal_conv(uu.view(), ww.view(), t_all.view(), y_all.view());
    Buffer t_part(DType::f32, {3, 3}), y_part(DType::f32, {7, 3});
    int64_t at = 0;
    for (int64_t len : {2, 1, 4}) {
        hymoe::Tensor yv = y_part.view().rows(at, len);
        ops::causal_conv(uu.view().rows(at, len), ww.view(), t_part.view(), yv);
        at += len;
    }
    for (int64_t i = 0; i < 21; ++i)
        BOOST_TEST(y_part.ptr<float>()[i] == y_all.ptr<float>()[i],
                   boost::test_tools::tolerance(1e-6f));
    for (int64_t i = 0; i < 9; ++i)
        BOOST_TEST(t_part.ptr<float>()[i] == t_all.ptr<float>()[i]);
}

BOOST_AUTO_TEST_CASE(buffers_zero_filled_unless_uninit_and_counted) {
    // A freed block reused by the next allocation of its size: the default fills it with zeros.
    for (int rep = 0; rep < 2; ++rep) {
        Buffer z(DType::f32, {37, 5});
        for (int64_t i = 0; i < 37 * 5; ++i) {
            BOOST_TEST(z.ptr<float>()[i] == 0.0f);
            z.ptr<float>()[i] = 1.0f;
        }
    }
    const int64_t before = hymoe::buffer_bytes().live;
    {
        Buffer u(DType::f32, {37, 5}, hymoe::uninit);  // [37, 5]: 740 bytes, padded to 768
        BOOST_TEST(u.view().shape == (hymoe::Shape{37, 5}));
        BOOST_TEST(reinterpret_cast<uintptr_t>(u.ptr<float>()) % 64 == 0);
        BOOST_TEST(hymoe::buffer_bytes().live == before + 768);
        for (int64_t i = 0; i < 37 * 5; ++i)
            u.ptr<float>()[i] = static_cast<float>(i);
        BOOST_TEST(u.ptr<float>()[184] == 184.0f);
    }
    BOOST_TEST(hymoe::buffer_bytes().live == before);
}

BOOST_AUTO_TEST_SUITE_END()
