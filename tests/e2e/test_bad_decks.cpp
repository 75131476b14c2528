// Every malformed deck under tests/decks/bad/ run through the real binary: exit code 2, exactly
// one line on stderr, equal to the line the deck's "# expect:" header gives (DECK stands for the
// deck's path), and nothing written next to the deck. Headers "# np: N" run it under mpirun and
// "# args: ..." add command-line arguments.
#include <algorithm>
#include <filesystem>
#include <set>

#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include "run_binary.h"

namespace fs = std::filesystem;
namespace data = boost::unit_test::data;
using hymoe::testing::run_hymoe;

namespace {

const char* const kBadDecks = "tests/decks/bad";

std::vector<std::string> bad_decks() {
    std::vector<std::string> decks;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(kBadDecks, ec))
        if (e.path().extension() == ".yaml")
            decks.push_back(e.path().string());
    std::sort(decks.begin(), decks.end());
    return decks;
}

// The value of a "# key: value" header line, or "".
std::string header(const std::string& text, const std::string& key) {
    std::string tag = "# " + key + ": ";
    size_t at = text.find(tag);
    if (at == std::string::npos)
        return "";
    size_t end = text.find('\n', at);
    return text.substr(at + tag.size(), end - at - tag.size());
}

std::set<std::string> listing(const std::string& dir) {
    std::set<std::string> names;
    for (const auto& e : fs::recursive_directory_iterator(dir))
        names.insert(e.path().string());
    return names;
}

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
    for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
        s.replace(at, from.size(), to);
    return s;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(bad_decks_suite)

BOOST_AUTO_TEST_CASE(there_are_at_least_30) {
    BOOST_TEST(bad_decks().size() >= 30u);
}

BOOST_DATA_TEST_CASE(exits_2_with_one_line_and_writes_nothing, data::make(bad_decks()), deck) {
    std::string text = hymoe::testing::read_text(deck);
    std::string expect = replace_all(header(text, "expect"), "DECK", deck);
    BOOST_REQUIRE(!expect.empty());
    std::string np = header(text, "np");
    std::set<std::string> before = listing(kBadDecks);
    auto r = run_hymoe("'" + deck + "' " + header(text, "args"), np.empty() ? 0 : std::stoi(np));
    BOOST_TEST(r.code == 2);
    auto lines = r.err_lines();
    BOOST_TEST(lines.size() == 1u, "stderr:\n" << r.err);
    if (!lines.empty())
        BOOST_TEST(lines[0] == expect);
    BOOST_TEST(r.out.empty(), "stdout:\n" << r.out);
    BOOST_TEST((listing(kBadDecks) == before));
}

BOOST_AUTO_TEST_SUITE_END()
