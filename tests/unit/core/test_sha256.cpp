// SHA-256 against the FIPS 180-4 / NIST example vectors, and incremental updates at odd split
// points (inside a block, across block boundaries, at the 55/56/64 padding edges) against one-shot.
#include <algorithm>
#include <string>

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

BOOST_AUTO_TEST_SUITE_END()
