// The GPU model's LoRA row lists (model/lora_rows.h) against a direct reading of lora.h's rule:
// every row's adapter, each listed row taken from it, every adapted row listed exactly once, in
// segments ordered by (group, adapter) with ascending rows; base (−1), out-of-range ids and
// dropped expert slots listed nowhere; an empty adapter list meaning adapter 0.
#include <algorithm>
#include <map>
#include <utility>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "hymoe/model/lora_rows.h"

using namespace hymoe::model;

namespace {

// (group, adapter) → its rows, read back from the lists; checks their order and disjointness.
std::map<std::pair<int64_t, int>, std::vector<int64_t>> read_back(const LoraRows& r) {
    std::map<std::pair<int64_t, int>, std::vector<int64_t>> by;
    int64_t next = 0;
    std::pair<int64_t, int> last{-1, -1};
    for (const LoraSegment& s : r.segments) {
        BOOST_TEST(s.begin == next);
        BOOST_TEST(s.count > 0);
        BOOST_TEST((std::make_pair(s.group, s.adapter) > last));
        last = {s.group, s.adapter};
        next += s.count;
        for (int64_t i = s.begin; i < s.begin + s.count; ++i) {
            if (i > s.begin)
                BOOST_TEST(r.rows[i] > r.rows[i - 1]);
            by[last].push_back(r.rows[i]);
        }
    }
    BOOST_TEST(next == static_cast<int64_t>(r.rows.size()));
    return by;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(lora_rows)

BOOST_AUTO_TEST_CASE(step_rows_group_sequences_by_adapter) {
    // sequences of 3, 1, 2, 4, 1 rows with adapters 1, base, 0, 1, 5 (5 ≥ n_adapters: nothing)
    const SeqBatch batch{{0, 3, 4, 6, 10, 11}, {0, 7, 0, 2, 9}, {1, -1, 0, 1, 5}};
    BOOST_TEST(lora_row_adapters(batch) == (std::vector<int>{1, 1, 1, -1, 0, 0, 1, 1, 1, 1, 5}),
               boost::test_tools::per_element());
    const LoraRows r = adapter_rows(batch, 2);
    const auto by = read_back(r);
    BOOST_TEST(by.size() == 2u);
    BOOST_TEST(by.at({0, 0}) == (std::vector<int64_t>{4, 5}), boost::test_tools::per_element());
    BOOST_TEST(by.at({0, 1}) == (std::vector<int64_t>{0, 1, 2, 6, 7, 8, 9}),
               boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(an_empty_adapter_list_is_adapter_zero_everywhere) {
    const SeqBatch batch{{0, 2, 5}, {0, 0}, {}};
    const LoraRows r = adapter_rows(batch, 1);
    BOOST_TEST(r.rows == (std::vector<int64_t>{0, 1, 2, 3, 4}), boost::test_tools::per_element());
    BOOST_REQUIRE(r.segments.size() == 1u);
    BOOST_TEST(r.segments[0].adapter == 0);
    BOOST_TEST(adapter_rows(batch, 0).rows.empty());  // no adapters loaded
    const SeqBatch base{{0, 2}, {0}, {-1}};
    BOOST_TEST(adapter_rows(base, 3).segments.empty());
}

BOOST_AUTO_TEST_CASE(expert_rows_split_each_group_by_adapter) {
    // 5 tokens, top-2, 3 experts; the grouped rows as moe.cpp plans them (each expert's tokens
    // ascending), slot 3 dropped
    const int64_t k = 2;
    const std::vector<int64_t> expert = {0, 2, 1, 0, 2, 1, 0, 1, 2, 0};  // [5, 2]
    const std::vector<bool> kept = {true, true, true, false, true, true, true, true, true, true};
    const std::vector<int> token_adapter = {1, -1, 0, 1, 0};
    std::vector<int64_t> count(3, 0);
    for (size_t a = 0; a < expert.size(); ++a)
        count[static_cast<size_t>(expert[a])] += kept[a] ? 1 : 0;
    std::vector<int64_t> offset = {
        0, count[0], count[0] + count[1], count[0] + count[1] + count[2]};
    std::vector<int64_t> cursor(offset.begin(), offset.end() - 1), row(expert.size(), -1);
    for (size_t a = 0; a < expert.size(); ++a)
        if (kept[a])
            row[a] = cursor[static_cast<size_t>(expert[a])]++;
    const LoraRows r = expert_adapter_rows(row, k, token_adapter, offset, 2);
    const auto by = read_back(r);
    // the reference: every kept slot of an adapted token, at its grouped row, under its expert
    std::map<std::pair<int64_t, int>, std::vector<int64_t>> want;
    for (size_t a = 0; a < expert.size(); ++a) {
        const int ad = token_adapter[a / k];
        if (kept[a] && ad >= 0)
            want[{expert[a], ad}].push_back(row[a]);
    }
    for (auto& [key, rows] : want)
        std::sort(rows.begin(), rows.end());
    BOOST_TEST(by.size() == want.size());
    for (const auto& [key, rows] : want) {
        BOOST_TEST_CONTEXT("expert " << key.first << ", adapter " << key.second) {
            BOOST_REQUIRE(by.count(key) == 1u);
            BOOST_TEST(by.at(key) == rows, boost::test_tools::per_element());
            for (int64_t g : rows)
                BOOST_TEST((g >= offset[key.first] && g < offset[key.first + 1]));
        }
    }
}

BOOST_AUTO_TEST_CASE(mismatched_lists_are_refused) {
    BOOST_CHECK_THROW(adapter_rows(SeqBatch{{0, 1, 2}, {0, 0}, {0}}, 1), std::exception);
    BOOST_CHECK_THROW(expert_adapter_rows({0, 1, 2}, 2, {0, 0}, {0, 3}, 1), std::exception);
}

BOOST_AUTO_TEST_SUITE_END()
