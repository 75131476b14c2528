// Two resolved decks compared as a rerun or a resume compares them (runtime/rerun.h): one value
// changed anywhere makes another deck; a key that only one holds (another hymoe version's new
// key and its default) does not, and is named by its dotted path; job.overwrite never counts.
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "hymoe/runtime/rerun.h"

namespace rt = hymoe::runtime;

namespace {

const std::string kDeck =
    "job: {kind: infer, name: a, overwrite: false}\n"
    "model: {preset: tiny, init: random}\n"
    "inference: {max_new_tokens: 8, stop: [\"\\n\"], sampling: {temperature: 0.7, top_k: 50}}\n";

}  // namespace

BOOST_AUTO_TEST_SUITE(rerun_decks)

BOOST_AUTO_TEST_CASE(the_same_deck_is_the_same) {
    const rt::DeckComparison c = rt::compare_resolved_decks(kDeck, kDeck);
    BOOST_TEST(c.same);
    BOOST_TEST(c.only_one.empty());
    BOOST_TEST(rt::results_deck_sha(kDeck) == rt::results_deck_sha(kDeck));
}

BOOST_AUTO_TEST_CASE(job_overwrite_is_left_out) {
    std::string other = kDeck;
    other.replace(other.find("overwrite: false"), 16, "overwrite: true");
    const rt::DeckComparison c = rt::compare_resolved_decks(kDeck, other);
    BOOST_TEST(c.same);
    BOOST_TEST(c.only_one.empty());
    BOOST_TEST(rt::results_deck_sha(kDeck) == rt::results_deck_sha(other));
}

BOOST_AUTO_TEST_CASE(a_changed_value_at_any_depth_is_another_deck) {
    for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
             {"temperature: 0.7", "temperature: 0.8"},  // nested map
             {"max_new_tokens: 8", "max_new_tokens: 9"},
             {"[\"\\n\"]", "[\"\\n\", \"x\"]"},  // a list
             {"preset: tiny", "preset: mid"}}) {
        std::string other = kDeck;
        other.replace(other.find(from), from.size(), to);
        const rt::DeckComparison c = rt::compare_resolved_decks(kDeck, other);
        BOOST_TEST(!c.same, to);
        BOOST_TEST(rt::results_deck_sha(kDeck) != rt::results_deck_sha(other));
    }
}

BOOST_AUTO_TEST_CASE(keys_one_version_lacks_are_listed_not_counted) {
    std::string newer = kDeck;  // a key added at the top and one inside a nested map
    newer.replace(newer.find("top_k: 50"), 9, "top_k: 50, min_p: 0");
    newer += "profile: {layers: false}\n";
    const rt::DeckComparison c = rt::compare_resolved_decks(kDeck, newer);
    BOOST_TEST(c.same);
    BOOST_TEST(c.only_one == (std::vector<std::string>{"inference.sampling.min_p", "profile"}),
               boost::test_tools::per_element());
    const rt::DeckComparison back = rt::compare_resolved_decks(newer, kDeck);  // a key dropped
    BOOST_TEST(back.same);
    BOOST_TEST(back.only_one.size() == 2u);
    BOOST_TEST(rt::version_keys_note(c).ends_with(": inference.sampling.min_p, profile"));

    std::string changed = newer;  // an added key does not hide a changed one
    changed.replace(changed.find("max_new_tokens: 8"), 17, "max_new_tokens: 4");
    BOOST_TEST(!rt::compare_resolved_decks(kDeck, changed).same);
}

BOOST_AUTO_TEST_SUITE_END()
