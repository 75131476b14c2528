// A chat template whose special tokens the tokenizer lacks is a deck error (exit 2) naming the
// deck key, found when the tokenizer loads, not a bad request blamed on the first dataset line.
// Each deck is written to a temporary folder (the jobs write their out/ there).
#include <filesystem>
#include <fstream>
#include <unistd.h>

#include <boost/test/unit_test.hpp>

#include "run_binary.h"

namespace fs = std::filesystem;
using hymoe::testing::run_hymoe;

namespace {

struct TempDeck {
    fs::path dir;
    std::string deck;
    explicit TempDeck(const std::string& name, const std::string& text) {
        dir = fs::temp_directory_path() / ("hymoe_chat_" + name + "_" + std::to_string(::getpid()));
        fs::remove_all(dir);
        fs::create_directories(dir);
        deck = (dir / "deck.yaml").string();
        std::ofstream(deck) << text;
    }
    ~TempDeck() { fs::remove_all(dir); }
};

std::string fixture(const std::string& p) {
    return fs::absolute(p).string();
}

}  // namespace

BOOST_AUTO_TEST_SUITE(chat_template_suite)

BOOST_AUTO_TEST_CASE(unknown_token_in_a_role_names_the_role_key) {
    TempDeck d("role",
               "job: {kind: tokenize}\n"
               "model: {preset: tiny}\n"
               "tokenizer:\n"
               "  path: " +
                   fixture("tests/decks/tokenize/tokenizer") +
                   "\n"
                   "  chat: kimi\n"
                   "  roles: {user: {prefix: \"<|no_such_token|>user\"}}\n"
                   "tokenize: {dataset: " +
                   fixture("tests/decks/tokenize/data.jsonl") + "}\n");
    auto r = run_hymoe(d.deck);
    BOOST_TEST(r.code == 2);
    auto lines = r.err_lines();
    BOOST_REQUIRE_EQUAL(lines.size(), 1u);
    BOOST_TEST(lines[0] == d.deck +
                               ":6:26: tokenizer.roles.user.prefix: unknown special token "
                               "'<|no_such_token|>' (not a token of the tokenizer " +
                               fixture("tests/decks/tokenize/tokenizer") + ")");
}

BOOST_AUTO_TEST_CASE(a_preset_the_tokenizer_does_not_fit_names_tokenizer_chat) {
    TempDeck d("preset",
               "job: {kind: infer}\n"
               "model: {preset: tiny, init: random}\n"
               "tokenizer: {path: " +
                   fixture("tests/decks/tokenize/tokenizer") +
                   ", chat: deepseek}\n"
                   "inference: {dataset: " +
                   fixture("tests/decks/tokenize/data.jsonl") + "}\n");
    auto r = run_hymoe(d.deck);
    BOOST_TEST(r.code == 2);
    auto lines = r.err_lines();
    BOOST_REQUIRE_EQUAL(lines.size(), 1u);
    BOOST_TEST(lines[0].find(d.deck + ":3:") == 0u, lines[0]);
    BOOST_TEST(lines[0].find(": tokenizer.chat: the deepseek preset's tokenizer.bos has an unknown "
                             "special token '<｜begin▁of▁sentence｜>'") != std::string::npos,
               lines[0]);
}

BOOST_AUTO_TEST_SUITE_END()
