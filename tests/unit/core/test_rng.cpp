// Philox4x32-10: the Random123 known-answer vectors (tests/kat_vectors), the keying of Philox
// (seed -> key, (offset/4, stream, subkey) -> counter), exact seek/offset restore, independence of
// streams, and loose moments of uniform() and normal().
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "hymoe/core/rng.h"

namespace {

using Block = std::array<uint32_t, 4>;
using Key = std::array<uint32_t, 2>;

struct Moments {
    double mean = 0, var = 0;
};
Moments moments(const std::vector<float>& x) {
    Moments m;
    for (float v : x)
        m.mean += static_cast<double>(v);
    m.mean /= static_cast<double>(x.size());
    for (float v : x)
        m.var += (static_cast<double>(v) - m.mean) * (static_cast<double>(v) - m.mean);
    m.var /= static_cast<double>(x.size());
    return m;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(core_rng)

// Random123 tests/kat_vectors, the three "philox4x32 10" lines: counter, key -> expected.
BOOST_AUTO_TEST_CASE(philox_known_answers) {
    BOOST_TEST((hymoe::philox4x32_10(Block{0, 0, 0, 0}, Key{0, 0}) ==
                Block{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
    BOOST_TEST((hymoe::philox4x32_10(Block{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
                                     Key{0xffffffff, 0xffffffff}) ==
                Block{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
    BOOST_TEST((hymoe::philox4x32_10(Block{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
                                     Key{0xa4093822, 0x299f31d0}) ==
                Block{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

BOOST_AUTO_TEST_CASE(philox_keying) {
    const uint64_t seed = 0x123456789abcdef0;
    const Key key{0x9abcdef0, 0x12345678};
    hymoe::Philox rng(seed, 7, 3);
    for (uint32_t b = 0; b < 3; ++b) {
        Block want = hymoe::philox4x32_10(Block{b, 0, 7, 3}, key);
        for (uint32_t w : want)
            BOOST_TEST(rng.next_u32() == w);
    }
    BOOST_TEST(rng.offset() == 12u);
    // The block index is 64-bit: offset 4 * 2^32 + 1 is word 1 of counter (0, 1, stream, subkey).
    rng.seek((uint64_t{1} << 34) + 1);
    BOOST_TEST(rng.next_u32() == hymoe::philox4x32_10(Block{0, 1, 7, 3}, key)[1]);
}

BOOST_AUTO_TEST_CASE(seek_restores_stream) {
    hymoe::Philox a(42, 1, 0);
    for (int i = 0; i < 7; ++i)  // an offset inside a block
        a.next_u32();
    a.normal();
    uint64_t saved = a.offset();
    BOOST_TEST(saved == 9u);
    std::vector<float> first(33), again(33);
    a.fill_normal(first.data(), first.size(), 0.0f, 1.0f);
    uint32_t next_first = a.next_u32();

    hymoe::Philox b(42, 1, 0);  // a fresh generator restored from the checkpointed offset
    b.seek(saved);
    b.fill_normal(again.data(), again.size(), 0.0f, 1.0f);
    BOOST_TEST(first == again);
    BOOST_TEST(b.next_u32() == next_first);

    a.seek(saved);  // and the same generator rewound
    a.fill_normal(again.data(), again.size(), 0.0f, 1.0f);
    BOOST_TEST(first == again);
    BOOST_TEST(a.offset() == saved + 34u);  // 2 * ceil(33 / 2) draws
}

BOOST_AUTO_TEST_CASE(streams_differ) {
    auto draws = [](uint64_t seed, uint32_t stream, uint32_t subkey) {
        hymoe::Philox rng(seed, stream, subkey);
        std::vector<uint32_t> x(16);
        for (uint32_t& v : x)
            v = rng.next_u32();
        return x;
    };
    auto base = draws(5, 0, 0);
    BOOST_TEST((draws(5, 0, 0) == base));
    BOOST_TEST((draws(5, 1, 0) != base));
    BOOST_TEST((draws(5, 0, 1) != base));
    BOOST_TEST((draws(6, 0, 0) != base));
    BOOST_TEST((draws(5, 1, 0) != draws(5, 0, 1)));
}

BOOST_AUTO_TEST_CASE(uniform_range_and_moments) {
    hymoe::Philox rng(2024, 0, 0);
    std::vector<float> x(100000);
    float lo = 1.0f, hi = 0.0f;
    for (float& v : x) {
        v = rng.uniform();
        lo = std::min(lo, v);
        hi = std::max(hi, v);
    }
    BOOST_TEST(lo >= 0.0f);
    BOOST_TEST(hi < 1.0f);
    Moments m = moments(x);
    BOOST_TEST(std::abs(m.mean - 0.5) < 0.01);
    BOOST_TEST(std::abs(m.var - 1.0 / 12.0) < 0.005);

    rng.fill_uniform(x.data(), x.size(), -2.0f, 3.0f);
    for (float v : x)
        BOOST_REQUIRE(v >= -2.0f && v <= 3.0f);
    BOOST_TEST(std::abs(moments(x).mean - 0.5) < 0.05);
}

BOOST_AUTO_TEST_CASE(normal_moments) {
    hymoe::Philox rng(7, 2, 9);
    std::vector<float> x(100000);
    for (float& v : x)
        v = rng.normal();
    Moments m = moments(x);
    BOOST_TEST(std::abs(m.mean) < 0.02);
    BOOST_TEST(std::abs(m.var - 1.0) < 0.03);

    rng.fill_normal(x.data(), x.size(), 3.0f, 0.5f);
    m = moments(x);
    for (float v : x)
        BOOST_REQUIRE(std::isfinite(v));
    BOOST_TEST(std::abs(m.mean - 3.0) < 0.01);
    BOOST_TEST(std::abs(m.var - 0.25) < 0.01);
}

BOOST_AUTO_TEST_SUITE_END()
