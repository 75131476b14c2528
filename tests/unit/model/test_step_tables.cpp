// A step's tables for a device (model/step_tables.h) on a hand-worked step: three sequences (a
// prefill chunk of 3 rows continuing at 2, and two decode rows at 5 and 9) over pages of 4 tokens:
// each row's sequence, position and visible keys; the block tables padded with −1 to the longest;
// the decode rows with their tables and keys; a table short of the keys refused.
#include <cstdint>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "hymoe/core/error.h"
#include "hymoe/model/step_tables.h"

using namespace hymoe;
using namespace hymoe::model;

namespace {

SeqBatch hand_step() {
    SeqBatch b;
    b.offsets = {0, 3, 4, 5};
    b.pos0 = {2, 5, 9};
    return b;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(step_tables)

BOOST_AUTO_TEST_CASE(rows_blocks_and_decode_rows_by_hand) {
    const SeqBatch b = hand_step();
    const RowTables r = row_tables(b);
    BOOST_TEST(r.row_seq == (std::vector<int32_t>{0, 0, 0, 1, 2}),
               boost::test_tools::per_element());
    BOOST_TEST(r.positions == (std::vector<int64_t>{2, 3, 4, 5, 9}),
               boost::test_tools::per_element());
    BOOST_TEST(r.visible == (std::vector<int32_t>{3, 4, 5, 6, 10}),
               boost::test_tools::per_element());

    const std::vector<int32_t> p0 = {7, 1}, p1 = {4, 2}, p2 = {0, 3, 5};  // 5, 6, 10 keys
    const BlockTables t = block_tables(b, {&p0, &p1, &p2}, 4);
    BOOST_TEST(t.max_pages == 3);
    BOOST_TEST(t.table == (std::vector<int32_t>{7, 1, -1, 4, 2, -1, 0, 3, 5}),
               boost::test_tools::per_element());

    const OneRows o = one_rows(b, t);
    BOOST_TEST(o.rows == (std::vector<int64_t>{3, 4}), boost::test_tools::per_element());
    BOOST_TEST(o.keys == (std::vector<int32_t>{6, 10}), boost::test_tools::per_element());
    BOOST_TEST(o.table == (std::vector<int32_t>{4, 2, -1, 0, 3, 5}),
               boost::test_tools::per_element());
    BOOST_TEST(o.max_keys == 10);
}

BOOST_AUTO_TEST_CASE(no_pages_and_short_tables) {
    const SeqBatch b = hand_step();
    const std::vector<int32_t> none;
    SeqBatch empty;
    empty.offsets = {0};
    const BlockTables t0 = block_tables(empty, {}, 4);  // no sequence: one empty column
    BOOST_TEST(t0.max_pages == 1);
    BOOST_TEST(t0.table.empty());
    const std::vector<int32_t> p0 = {7}, p1 = {4, 2}, p2 = {0, 3, 5};  // p0: 4 < 5 keys
    BOOST_CHECK_THROW(block_tables(b, {&p0, &p1, &p2}, 4), Error);
    BOOST_CHECK_THROW(block_tables(b, {&p1, &p2}, 4), Error);  // a table short
}

BOOST_AUTO_TEST_SUITE_END()
