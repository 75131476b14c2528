// bf16 and fp16 conversions: exact values, rounding to nearest even, NaN, infinities, subnormals.
#include <cmath>
#include <limits>

#include <boost/test/unit_test.hpp>

#include "hymoe/core/types.h"

BOOST_AUTO_TEST_SUITE(types)

BOOST_AUTO_TEST_CASE(bf16_round_trip_and_rounding) {
    using hymoe::bf16_to_float;
    using hymoe::float_to_bf16;
    BOOST_TEST(float_to_bf16(1.0f) == 0x3f80);
    BOOST_TEST(float_to_bf16(-2.0f) == 0xc000);
    BOOST_TEST(bf16_to_float(0x3fc0) == 1.5f);
    // 1 + 2^-8 is halfway between bf16 1.0 and 1.0078125: ties to even → 1.0
    BOOST_TEST(float_to_bf16(1.00390625f) == 0x3f80);
    // 1 + 3·2^-8 is halfway between 1.0078125 (odd) and 1.015625 (even) → even
    BOOST_TEST(float_to_bf16(1.01171875f) == 0x3f82);
    BOOST_TEST(std::isnan(bf16_to_float(float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
    BOOST_TEST(bf16_to_float(float_to_bf16(INFINITY)) == INFINITY);
}

BOOST_AUTO_TEST_CASE(f16_round_trip_and_limits) {
    using hymoe::f16_to_float;
    using hymoe::float_to_f16;
    BOOST_TEST(float_to_f16(1.0f) == 0x3c00);
    BOOST_TEST(float_to_f16(-2.5f) == 0xc100);
    BOOST_TEST(float_to_f16(65504.0f) == 0x7bff);
    BOOST_TEST(float_to_f16(65520.0f) == 0x7c00);  // rounds up to inf
    BOOST_TEST(f16_to_float(0x0001) == std::ldexp(1.0f, -24));
    BOOST_TEST(float_to_f16(std::ldexp(1.0f, -24)) == 0x0001);
    BOOST_TEST(float_to_f16(std::ldexp(1.0f, -25)) == 0x0000);         // tie to even (0)
    BOOST_TEST(float_to_f16(std::ldexp(3.0f, -25)) == 0x0002);         // 1.5 ulp → 2
    BOOST_TEST(float_to_f16(1.0f + std::ldexp(1.0f, -11)) == 0x3c00);  // tie to even
    BOOST_TEST(std::isnan(f16_to_float(float_to_f16(NAN))));
    for (uint32_t h = 0; h < 0x7c00; ++h)  // every finite positive half survives a round trip
        BOOST_REQUIRE(float_to_f16(f16_to_float(static_cast<uint16_t>(h))) == h);
}

BOOST_AUTO_TEST_SUITE_END()
