// SHA-256 against the FIPS 180-4 / NIST example vectors, and incremental updates at odd split
// points (inside a block, across block boundaries, at the 55/56/64 padding edges) against one-shot;
// the SHA-NI block path against the portable one.
#include <algorithm>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "hymoe/core/sha256.h"

BOOST_AUTO_TEST_SUITE(core_sha256)

BOOST_AUTO_TEST_CASE(nist_vectors) {
    BOOST_TEST(hymoe::sha256_hex("") ==
               "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    BOOST_TEST(hymoe::sha256_hex("abc") ==
               "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    BOOST_TEST(hymoe::sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
               "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

BOOST_AUTO_TEST_CASE(million_a) {
    hymoe::Sha256 h;
    std::string chunk(1000, 'a');
    for (int i = 0; i < 1000; ++i)
        h.update(chunk);
    BOOST_TEST(h.hex_digest() ==
               "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    BOOST_TEST(hymoe::sha256_hex(std::string(1000000, 'a')) == h.hex_digest());
}

BOOST_AUTO_TEST_CASE(incremental_equals_one_shot) {
    std::string msg;
    for (int i = 0; i < 300; ++i)
        msg += static_cast<char>((i * 131 + 7) % 256);
    for (size_t len : {0, 1, 55, 56, 57, 63, 64, 65, 119, 120, 128, 300}) {
        std::string m = msg.substr(0, len);
        std::string want = hymoe::sha256_hex(m);
        for (size_t step : {1, 3, 7, 13, 63, 64, 65}) {
            hymoe::Sha256 h;
            for (size_t at = 0; at < m.size(); at += step)
                h.update(m.data() + at, std::min(step, m.size() - at));
            BOOST_TEST(h.hex_digest() == want, "len " << len << " step " << step);
        }
    }
}

BOOST_AUTO_TEST_CASE(digest_is_repeatable_and_extendable) {
    hymoe::Sha256 h;
    h.update("ab");
    std::string partial = h.hex_digest();
    BOOST_TEST(h.hex_digest() == partial);  // reading does not finalise
    h.update("c");
    BOOST_TEST(h.hex_digest() == hymoe::sha256_hex("abc"));
}

// The SHA-NI block path (where the CPU has it) and the portable one give the same digests, over
// lengths around the block edges and a few MB, fed whole and in odd pieces.
BOOST_AUTO_TEST_CASE(hardware_equals_portable) {
    BOOST_TEST_MESSAGE("SHA extensions in use: " << hymoe::sha256_hardware_in_use());
    std::string data(3 * 1024 * 1024 + 17, '\0');
    uint32_t x = 12345;
    for (char& c : data)
        c = static_cast<char>((x = x * 1664525u + 1013904223u) >> 24);
    auto digests = [&] {
        std::vector<std::string> out;
        for (size_t len : {0, 1, 63, 64, 65, 127, 128, 129, 1000, 4096, 65537})
            out.push_back(hymoe::sha256_hex(std::string_view(data).substr(0, len)));
        hymoe::Sha256 h;
        for (size_t at = 0; at < data.size(); at += 777)
            h.update(data.data() + at, std::min<size_t>(777, data.size() - at));
        out.push_back(h.hex_digest());
        out.push_back(
            hymoe::sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"));
        return out;
    };
    const bool had = hymoe::sha256_hardware_in_use();
    const std::vector<std::string> fast = digests();
    hymoe::sha256_use_hardware(false);
    const std::vector<std::string> portable = digests();
    hymoe::sha256_use_hardware(had);
    BOOST_TEST(fast == portable, boost::test_tools::per_element());
    BOOST_TEST(portable.back() ==
               "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

BOOST_AUTO_TEST_SUITE_END()
