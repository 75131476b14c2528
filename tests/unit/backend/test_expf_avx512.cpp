// expf_array (the AVX-512 lanes of glibc's expf) against std::exp bit for bit: every 251st fp32
// bit pattern (17M inputs over both signs, subnormals, the |x| ≥ 88 slow path, inf and NaN) in
// both signs, odd lengths for the scalar tail, and in place. The whole 2³² was checked once by
// hand (0 mismatches, glibc 2.36); where libm is another expf the scalar path runs and this holds
// trivially.
#include <bit>
#include <cmath>
#include <cstdint>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "../../../src/backend/cpu/expf_avx512.h"

namespace detail = hymoe::ops::detail;

namespace {

bool same(float a, float b) {
    return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b) ||
           (std::isnan(a) && std::isnan(b));
}

}  // namespace

BOOST_AUTO_TEST_SUITE(expf_avx512)

BOOST_AUTO_TEST_CASE(equals_std_exp_bit_for_bit) {
    BOOST_TEST_MESSAGE("vector lanes: " << detail::expf_vector());
    const int64_t n = 4099;  // not a multiple of 16: the scalar tail runs too
    std::vector<float> x(n), y(n);
    int64_t bad = 0, checked = 0;
    for (uint64_t bits = 0; bits < (uint64_t{1} << 32);) {
        for (int64_t i = 0; i < n; ++i, bits += 251)
            x[static_cast<size_t>(i)] = std::bit_cast<float>(static_cast<uint32_t>(bits));
        for (bool negate : {false, true}) {
            detail::expf_array(x.data(), negate, y.data(), n);
            for (int64_t i = 0; i < n; ++i) {
                const float xi = x[static_cast<size_t>(i)];
                bad += same(y[static_cast<size_t>(i)], std::exp(negate ? -xi : xi)) ? 0 : 1;
            }
            checked += n;
        }
    }
    BOOST_TEST(checked > 30'000'000);
    BOOST_TEST(bad == 0);
}

BOOST_AUTO_TEST_CASE(in_place_and_edges) {
    std::vector<float> x = {0.0f,
                            -0.0f,
                            1.0f,
                            -1.0f,
                            88.0f,
                            88.73f,
                            -103.0f,
                            -104.0f,
                            INFINITY,
                            -INFINITY,
                            NAN,
                            1e-30f,
                            0.5f,
                            -87.9f,
                            20.0f,
                            -20.0f,
                            3.0f};
    const std::vector<float> in = x;
    detail::expf_array(x.data(), true, x.data(), static_cast<int64_t>(x.size()));
    for (size_t i = 0; i < x.size(); ++i)
        BOOST_TEST(same(x[i], std::exp(-in[i])), "x = " << in[i]);
}

BOOST_AUTO_TEST_SUITE_END()
