// A chat template whose special tokens the tokenizer lacks is a deck error (exit 2) naming the
// deck key, found when the tokenizer loads, not a bad request blamed on the first dataset line.
// Each deck is written to a temporary folder (the jobs write their out/ there).
#include <filesystem>
#include <fstream>
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <nlohmann/json.hpp>

#include "hymoe/io/h5.h"
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

// tokenizer.chat: template: the Kimi K2 chat_template (tests/text/chat/kimi-k2, from llama.cpp's
// models/templates) put into the tokenize fixture's tokenizer_config.json. On the fixture data
// (its one conversation has a system message) the tokenize job writes exactly the kimi preset's
// tokens and loss mask; errors name the deck key, the file and the template's line.
namespace {

// A copy of tests/decks/tokenize/tokenizer whose tokenizer_config.json has this chat_template.
void tokenizer_with_template(const fs::path& dir, const std::string& chat_template) {
    fs::create_directories(dir);
    fs::copy_file(fixture("tests/decks/tokenize/tokenizer/tiktoken.model"), dir / "tiktoken.model");
    std::ifstream in(fixture("tests/decks/tokenize/tokenizer/tokenizer_config.json"));
    nlohmann::json cfg = nlohmann::json::parse(in);
    if (!chat_template.empty())
        cfg["chat_template"] = chat_template;
    std::ofstream(dir / "tokenizer_config.json") << cfg.dump(1);
}

std::string kimi_template() {
    std::ifstream in(fixture("tests/text/chat/kimi-k2/tokenizer_config.json"));
    return nlohmann::json::parse(in)["chat_template"].get<std::string>();
}

std::string tokenize_deck(const TempDeck& d, const std::string& chat, const std::string& out) {
    return "job: {kind: tokenize, output: " + (d.dir / out).string() +
           "}\nmodel: {preset: mid}\ntokenizer: {path: " + (d.dir / "tok").string() +
           ", chat: " + chat +
           "}\ntokenize: {dataset: " + fixture("tests/decks/tokenize/data.jsonl") +
           ", eos: \"<|im_end|>\"}\n";
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

BOOST_AUTO_TEST_CASE(the_models_template_tokenizes_as_the_preset) {
    TempDeck d("jinja", "");
    tokenizer_with_template(d.dir / "tok", kimi_template());
    for (const char* chat : {"template", "kimi"}) {
        std::ofstream(d.deck) << tokenize_deck(d, chat, chat);
        auto r = run_hymoe(d.deck);
        BOOST_TEST_REQUIRE(r.code == 0, r.err);
    }
    hymoe::io::H5Reader a((d.dir / "template/tokens.h5").string());
    hymoe::io::H5Reader b((d.dir / "kimi/tokens.h5").string());
    BOOST_TEST(a.ints("/tokens").size() > 40u);
    for (const char* name : {"/tokens", "/offsets", "/loss_mask", "/line"})
        BOOST_TEST(a.ints(name) == b.ints(name), name);
}

BOOST_AUTO_TEST_CASE(template_errors_name_the_key_file_and_line) {
    TempDeck d("jinja_bad", "");
    // no chat_template in the folder's tokenizer_config.json
    tokenizer_with_template(d.dir / "tok", "");
    std::ofstream(d.deck) << tokenize_deck(d, "template", "out");
    auto r = run_hymoe(d.deck);
    BOOST_TEST(r.code == 2);
    const std::string cfg = (d.dir / "tok/tokenizer_config.json").string();
    const std::string line = r.err_lines().at(0);
    BOOST_TEST(line.find(d.deck + ":3:") == 0u, line);
    BOOST_TEST(line.ends_with(": tokenizer.chat: " + cfg + ": has no chat_template"), line);
    // a construct outside the subset, on the template's line 2
    fs::remove_all(d.dir / "tok");
    tokenizer_with_template(d.dir / "tok", "{{ bos_token }}\n{% macro m() %}{% endmacro %}");
    r = run_hymoe(d.deck);
    BOOST_TEST(r.code == 2);
    BOOST_TEST(r.err.find(": tokenizer.chat: " + cfg +
                          ": chat_template line 2: the tag {% macro %} is outside hymoe's Jinja "
                          "subset (if, elif, else, for, set)") != std::string::npos,
               r.err);
    // a special token the tokenizer lacks, found by the sample conversation
    fs::remove_all(d.dir / "tok");
    tokenizer_with_template(d.dir / "tok",
                            "{% for m in messages %}<|no_such|>{{ m.content }}{% endfor %}");
    r = run_hymoe(d.deck);
    BOOST_TEST(r.code == 2);
    BOOST_TEST(r.err.find(": tokenizer.chat: the chat_template on a user, assistant, user "
                          "conversation: unknown special token '<|no_such|>'") != std::string::npos,
               r.err);
    // the preset keys do not go with it
    {
        std::string text = tokenize_deck(d, "template", "out");
        text.insert(text.find(", chat: template"), ", bos: \"[BOS]\"");
        std::ofstream(d.deck) << text;
    }
    r = run_hymoe(d.deck);
    BOOST_TEST(r.code == 2);
    BOOST_TEST(
        r.err.find(": tokenizer.bos: not with tokenizer.chat: template") != std::string::npos,
        r.err);
}

BOOST_AUTO_TEST_SUITE_END()
