// The device arena's bookkeeping (OffsetAllocator) on the CPU: alignment and size rounding,
// first fit, no room -> none, a bad free refused, neighbours merged back into one block, and a
// random allocate/free sequence checked against a byte map for overlaps and used-byte totals.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "hymoe/backend/cuda_arena.h"
#include "hymoe/core/error.h"
#include "hymoe/core/rng.h"

using hymoe::backend::cuda::OffsetAllocator;

BOOST_AUTO_TEST_SUITE(cuda_arena_book)

BOOST_AUTO_TEST_CASE(aligned_rounded_first_fit_and_full) {
    OffsetAllocator a(1024);
    const size_t x = a.allocate(10, 256);  // rounded up to 256
    BOOST_TEST(x == 0u);
    const size_t y = a.allocate(1, 64);
    BOOST_TEST(y == 256u);
    const size_t z = a.allocate(0, 128);  // zero bytes still get one unit, 128-aligned
    BOOST_TEST(z == 384u);
    BOOST_TEST(a.used() == 256u + 64u + 128u);
    BOOST_TEST(a.allocate(600, 256) == OffsetAllocator::none);  // 512 left, not 768
    BOOST_TEST(a.allocate(512, 512) == 512u);
    BOOST_TEST(a.largest_free() == 64u);  // [320, 384) is the padding before z
    a.free(y);
    BOOST_TEST(a.allocate(100, 32) == 256u);  // first fit takes the freed block again
    BOOST_CHECK_THROW(a.free(7), hymoe::Error);
    BOOST_CHECK_THROW(a.allocate(8, 3), hymoe::Error);  // not a power of two
}

BOOST_AUTO_TEST_CASE(freeing_everything_merges_back_to_one_block) {
    OffsetAllocator a(4096);
    std::vector<size_t> offs;
    for (int i = 0; i < 16; ++i)
        offs.push_back(a.allocate(256, 256));
    BOOST_TEST(a.free_blocks() == 0u);
    for (size_t i : {3, 1, 2, 0, 15, 8, 10, 9, 4, 7, 5, 6, 12, 14, 13, 11})
        a.free(offs[i]);
    BOOST_TEST(a.free_blocks() == 1u);
    BOOST_TEST(a.largest_free() == 4096u);
    BOOST_TEST(a.used() == 0u);
    BOOST_TEST(a.peak() == 4096u);
    a.allocate(100, 256);
    a.reset();
    BOOST_TEST(a.live_blocks() == 0u);
    BOOST_TEST(a.largest_free() == 4096u);
}

BOOST_AUTO_TEST_CASE(random_sequence_never_overlaps) {
    const size_t cap = 1 << 16;
    OffsetAllocator a(cap);
    std::vector<int> owner(cap, -1);  // byte -> live block id
    struct Live {
        size_t off, size;
    };
    std::vector<Live> live;
    hymoe::Philox rng(7, 0, 0);
    size_t used = 0;
    for (int step = 0; step < 2000; ++step) {
        const float u[3] = {rng.uniform(), rng.uniform(), rng.uniform()};
        if (u[0] < 0.55f || live.empty()) {
            const size_t bytes = static_cast<size_t>(u[1] * 3000.0f);
            const size_t align = size_t{1} << static_cast<int>(u[2] * 9.0f);
            const size_t off = a.allocate(bytes, align);
            if (off == OffsetAllocator::none)
                continue;
            const size_t size = (std::max<size_t>(bytes, 1) + align - 1) / align * align;
            BOOST_REQUIRE(off % align == 0);
            BOOST_REQUIRE(off + size <= cap);
            for (size_t b = off; b < off + size; ++b) {
                BOOST_REQUIRE(owner[b] == -1);
                owner[b] = step;
            }
            live.push_back({off, size});
            used += size;
        } else {
            const size_t i =
                static_cast<size_t>(u[1] * static_cast<float>(live.size())) % live.size();
            a.free(live[i].off);
            for (size_t b = live[i].off; b < live[i].off + live[i].size; ++b)
                owner[b] = -1;
            used -= live[i].size;
            live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
        }
        BOOST_REQUIRE(a.used() == used);
    }
    for (const Live& l : live)
        a.free(l.off);
    BOOST_TEST(a.free_blocks() == 1u);
}

BOOST_AUTO_TEST_SUITE_END()
