// The deck's tokenizer and tokenize sections: defaults, the chat preset with a role overridden,
// the tokenize job's required sections, and their error lines.
#include <filesystem>
#include <fstream>
#include <string>

#include <boost/test/unit_test.hpp>

#include "hymoe/core/error.h"
#include "hymoe/deck/deck.h"

namespace fs = std::filesystem;
using hymoe::deck::Deck;
using hymoe::deck::parse_deck;

namespace {

struct TextFolder {
    fs::path dir = fs::temp_directory_path() / ("hymoe_deck_text_" + std::to_string(::getpid()));
    TextFolder() {
        fs::create_directories(dir / "tok");
        std::ofstream(dir / "tok" / "tiktoken.model") << "YQ== 0\n";
        std::ofstream(dir / "data.jsonl") << "{\"text\": \"a\"}\n";
    }
    ~TextFolder() { fs::remove_all(dir); }
    std::string deck() const { return (dir / "deck.yaml").string(); }
};

const std::string kTokenize =
    "job: {kind: tokenize}\n"
    "model: {preset: tiny}\n"
    "tokenizer: {path: tok, chat: kimi, roles: {user: {prefix: 'U:'}}}\n"
    "tokenize: {dataset: data.jsonl, eos: '<|im_end|>'}\n";

std::string error_of(const std::string& text, const std::string& path) {
    try {
        parse_deck(text, path, {});
    } catch (const hymoe::Error& e) {
        return e.what();
    }
    return "no error";
}

}  // namespace

BOOST_AUTO_TEST_SUITE(deck_text)

BOOST_AUTO_TEST_CASE(tokenize_deck_defaults_and_chat_preset) {
    TextFolder f;
    const Deck d = parse_deck(kTokenize, f.deck(), {});
    BOOST_TEST((d.job.kind == hymoe::deck::JobKind::tokenize));
    BOOST_TEST(d.tokenizer.path == (f.dir / "tok").lexically_normal().string());
    BOOST_TEST(d.tokenize.output == (f.dir / "out" / "tokens.h5").lexically_normal().string());
    BOOST_TEST(d.tokenize.on_bad_request == "fail");
    BOOST_TEST(d.tokenize.chunk_lines == 4096);
    const auto& roles = d.tokenizer.chat_template.roles;
    BOOST_TEST(roles.at("user").prefix == "U:");          // overridden
    BOOST_TEST(roles.at("user").suffix == "<|im_end|>");  // from the kimi preset
    BOOST_TEST(roles.at("assistant").prefix == "<|im_assistant|>assistant<|im_middle|>");
    BOOST_TEST(d.resolved_yaml.find("generation_prefix") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(tokenize_deck_errors) {
    TextFolder f;
    const std::string p = f.deck();
    BOOST_TEST(
        error_of("job: {kind: tokenize}\nmodel: {preset: tiny}\ntokenize: {dataset: data.jsonl}\n",
                 p) ==
        p + ":1:1: tokenizer: required for a tokenize job (at least tokenizer.path)");
    BOOST_TEST(
        error_of("job: {kind: tokenize}\nmodel: {preset: tiny}\ntokenizer: {path: tok}\n", p) ==
        p + ":1:1: tokenize: required for a tokenize job (at least tokenize.dataset)");
    BOOST_TEST(error_of(kTokenize + "parallel: {dp: 1}\n", p) == "no error");
    BOOST_TEST(
        error_of("job: {kind: plan}\nmodel: {preset: tiny}\ntokenize: {dataset: data.jsonl}\n",
                 p) == p + ":3:11: tokenize: allowed only when job.kind is tokenize");
    BOOST_TEST(
        error_of(
            "job: {kind: tokenize}\nmodel: {preset: tiny}\ntokenizer: {path: tok, chat: llama}\n"
            "tokenize: {dataset: data.jsonl}\n",
            p)
            .find("tokenizer.chat: 'llama' is not allowed (allowed: none, kimi, deepseek, "
                  "template)") != std::string::npos);
}

BOOST_AUTO_TEST_SUITE_END()
