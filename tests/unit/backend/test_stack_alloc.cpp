// The decode graphs' workspace bookkeeping (StackAllocator) on the CPU: aligned bump offsets,
// the top restored by each release, the same offsets for the same sequence of sizes, a release
// out of order and an overflow refused with nothing changed, and nested scopes checked against a
// byte map for overlaps.
#include <cstddef>
#include <cstdint>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "hymoe/backend/stack_alloc.h"
#include "hymoe/core/error.h"
#include "hymoe/core/rng.h"

using hymoe::backend::cuda::StackAllocator;

BOOST_AUTO_TEST_SUITE(workspace_stack)

BOOST_AUTO_TEST_CASE(aligned_offsets_and_lifo_release) {
    StackAllocator a(4096);
    const size_t x = a.push(10, 256);
    const size_t y = a.push(0, 64);  // zero bytes still take one byte
    const size_t z = a.push(300, 256);
    BOOST_TEST(x == 0u);
    BOOST_TEST(y == 64u);
    BOOST_TEST(z == 256u);
    BOOST_TEST(a.used() == 556u);
    BOOST_TEST(a.depth() == 3u);
    a.pop(z);
    BOOST_TEST(a.used() == 65u);
    BOOST_TEST(a.push(300, 256) == z);  // the same size lands at the same offset again
    a.pop(z);
    a.pop(y);
    a.pop(x);
    BOOST_TEST(a.used() == 0u);
    BOOST_TEST(a.depth() == 0u);
    BOOST_TEST(a.peak() == 556u);
}

BOOST_AUTO_TEST_CASE(out_of_order_release_and_overflow_fail) {
    StackAllocator a(1024);
    const size_t x = a.push(100, 256);
    const size_t y = a.push(100, 256);
    BOOST_CHECK_THROW(a.pop(x), hymoe::Error);          // y is on top
    BOOST_TEST(a.depth() == 2u);                        // nothing changed
    BOOST_CHECK_THROW(a.push(600, 256), hymoe::Error);  // 512 + 600 > 1024
    BOOST_CHECK_THROW(a.push(1, 3), hymoe::Error);      // not a power of two
    BOOST_TEST(a.used() == 356u);
    BOOST_TEST(a.push(512, 512) == 512u);  // exactly fills it
    BOOST_CHECK_THROW(a.push(1, 1), hymoe::Error);
    a.pop(512);
    a.pop(y);
    a.pop(x);
    BOOST_CHECK_THROW(a.pop(0), hymoe::Error);  // empty
}

// Scopes that nest (each gives back its blocks in reverse), random sizes: no two live blocks
// overlap, every block is aligned and inside, and the run repeats with the same offsets.
BOOST_AUTO_TEST_CASE(nested_scopes_never_overlap_and_repeat_their_offsets) {
    const size_t cap = 1 << 16;
    std::vector<size_t> first_run;
    for (int run = 0; run < 2; ++run) {
        StackAllocator a(cap);
        std::vector<int> owner(cap, -1);  // byte -> live block id
        hymoe::Philox rng(5, 0, 0);
        std::vector<size_t> offsets;
        int next_id = 0;
        // a scope: a few blocks, maybe an inner scope between them, then its blocks in reverse
        auto scope = [&](auto&& self, int level) -> void {
            std::vector<std::pair<size_t, size_t>> mine;  // (offset, bytes)
            const int n = 1 + static_cast<int>(rng.next_u32() % 3);
            for (int i = 0; i < n; ++i) {
                const size_t bytes = rng.next_u32() % 700;
                const size_t align = size_t{1} << (rng.next_u32() % 9);
                const size_t off = a.push(bytes, align);
                BOOST_REQUIRE(off % align == 0);
                BOOST_REQUIRE(off + std::max<size_t>(bytes, 1) <= cap);
                const int id = next_id++;
                for (size_t b = off; b < off + bytes; ++b) {
                    BOOST_REQUIRE(owner[b] == -1);
                    owner[b] = id;
                }
                mine.emplace_back(off, bytes);
                offsets.push_back(off);
                if (level < 4 && rng.next_u32() % 2 == 0)
                    self(self, level + 1);
            }
            for (auto it = mine.rbegin(); it != mine.rend(); ++it) {
                for (size_t b = it->first; b < it->first + it->second; ++b)
                    owner[b] = -1;
                a.pop(it->first);
            }
        };
        for (int k = 0; k < 20; ++k)
            scope(scope, 0);
        BOOST_TEST(a.depth() == 0u);
        if (run == 0)
            first_run = offsets;
        else
            BOOST_TEST(offsets == first_run, boost::test_tools::per_element());
    }
}

BOOST_AUTO_TEST_SUITE_END()
