// DecodeBuckets (hymoe/backend/cuda_graph.h) on the CPU: the default sizes (powers of two, then
// the maximum), given sizes sorted and deduplicated, every batch 1..max sent to the smallest
// bucket that holds it, and batches and sizes out of range refused.
#include <vector>

#include <boost/test/unit_test.hpp>

#include "hymoe/backend/cuda_graph.h"
#include "hymoe/core/error.h"

using hymoe::backend::cuda::DecodeBuckets;

BOOST_AUTO_TEST_SUITE(decode_buckets)

BOOST_AUTO_TEST_CASE(default_sizes) {
    BOOST_TEST(DecodeBuckets(1).sizes() == std::vector<int>({1}), boost::test_tools::per_element());
    BOOST_TEST(DecodeBuckets(100).sizes() == std::vector<int>({1, 2, 4, 8, 16, 32, 64, 100}),
               boost::test_tools::per_element());
    BOOST_TEST(DecodeBuckets(128).sizes() == std::vector<int>({1, 2, 4, 8, 16, 32, 64, 128}),
               boost::test_tools::per_element());
    BOOST_TEST(DecodeBuckets(3).sizes() == std::vector<int>({1, 2, 3}),
               boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(every_batch_gets_the_smallest_bucket_that_holds_it) {
    for (const DecodeBuckets& b : {DecodeBuckets(100), DecodeBuckets({48, 8, 8, 1, 24})}) {
        for (int n = 1; n <= b.max(); ++n) {
            const int i = b.index_for(n), size = b.bucket_for(n);
            BOOST_TEST_INFO("batch " << n);
            BOOST_TEST(size >= n);
            BOOST_TEST_INFO("batch " << n);
            BOOST_TEST((i == 0 || b.sizes()[static_cast<size_t>(i - 1)] < n));
            BOOST_TEST(b.padding(n) == size - n);
        }
    }
    const DecodeBuckets given({48, 8, 8, 1, 24});
    BOOST_TEST(given.sizes() == std::vector<int>({1, 8, 24, 48}), boost::test_tools::per_element());
    BOOST_TEST(given.bucket_for(9) == 24);
    BOOST_TEST(given.bucket_for(48) == 48);
    BOOST_TEST(given.count() == 4);
}

BOOST_AUTO_TEST_CASE(out_of_range_refused) {
    const DecodeBuckets b(16);
    BOOST_CHECK_THROW(b.index_for(0), hymoe::Error);
    BOOST_CHECK_THROW(b.index_for(17), hymoe::Error);
    BOOST_CHECK_THROW(DecodeBuckets(0), hymoe::Error);
    BOOST_CHECK_THROW(DecodeBuckets(std::vector<int>{}), hymoe::Error);
    BOOST_CHECK_THROW(DecodeBuckets(std::vector<int>{0, 4}), hymoe::Error);
}

BOOST_AUTO_TEST_SUITE_END()
