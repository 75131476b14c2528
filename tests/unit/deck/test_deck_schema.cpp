// The deck schema table against the parser: every key a full deck resolves is described by
// --describe-deck (so the generated reference lists what the parser reads), a section's
// description names its keys, unknown sections are refused, and the parser reports a misspelt
// section as an unknown key at its own line and a map-valued --set's errors at the --set.
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <yaml-cpp/yaml.h>

#include "hymoe/core/error.h"
#include "hymoe/deck/deck.h"
#include "hymoe/deck/describe.h"
#include "hymoe/text/chat.h"

namespace fs = std::filesystem;
using hymoe::deck::describe_deck;
using hymoe::deck::parse_deck;

namespace {

struct Folder {
    fs::path dir;
    Folder() {
        dir = fs::temp_directory_path() / ("hymoe_schema_test_" + std::to_string(::getpid()));
        fs::create_directories(dir / "ad");
        for (const char* f : {"p.jsonl", "d.h5", "g.h5", "tok.tiktoken"})
            std::ofstream(dir / f) << "x\n";
    }
    ~Folder() { fs::remove_all(dir); }
    std::string deck() const { return (dir / "deck.yaml").string(); }
};

// Every key path of a resolved deck's leaves ("inference.batch.max_tokens").
void leaves(const YAML::Node& n, const std::string& path, std::vector<std::string>& out) {
    if (!n.IsMap()) {
        out.push_back(path);
        return;
    }
    for (auto it = n.begin(); it != n.end(); ++it)
        leaves(
            it->second, path.empty() ? it->first.Scalar() : path + "." + it->first.Scalar(), out);
}

std::string error_of(const std::string& text,
                     const std::string& path,
                     const std::vector<std::string>& sets = {}) {
    try {
        parse_deck(text, path, sets);
    } catch (const hymoe::Error& e) {
        BOOST_TEST((e.code() == hymoe::Exit::invalid));
        return e.what();
    }
    return "no error";
}

}  // namespace

BOOST_AUTO_TEST_SUITE(deck_schema)

BOOST_AUTO_TEST_CASE(every_resolved_key_is_described_in_its_section) {
    Folder f;
    const std::string text =
        "job: {kind: lora}\n"
        "model: {preset: tiny, init: random}\n"
        "finetune: {data: {domain: d.h5, general: g.h5}, steps: 2, eval: {every: 1, domain: "
        "d.h5}}\n"
        "inference: {dataset: p.jsonl, adapters: {a: ad}}\n"
        "tokenizer: {path: tok.tiktoken, chat: kimi}\n";
    const auto d = parse_deck(text, f.deck(), {});
    std::vector<std::string> keys;
    leaves(YAML::Load(d.resolved_yaml), "", keys);
    BOOST_TEST(keys.size() > 90u);
    for (const std::string& k : keys) {
        const std::string top = k.substr(0, k.find('.'));
        const std::string rest = k.substr(k.find('.') + 1);
        const std::string sub = k.rfind("inference.adapters", 0) == 0 ? "adapters" : rest;
        BOOST_TEST(describe_deck(top).find("| `" + sub + "` |") != std::string::npos, k);
    }
}

BOOST_AUTO_TEST_CASE(the_reference_holds_every_section_and_refuses_unknown_ones) {
    const std::string all = describe_deck("");
    for (const char* s : {"job",
                          "model",
                          "parallel",
                          "finetune",
                          "inference",
                          "tokenizer",
                          "tokenize",
                          "profile",
                          "hardware",
                          "plan"})
        BOOST_TEST(all.find(std::string("\n## `") + s + "`\n") != std::string::npos, s);
    const std::string batch = describe_deck("inference.batch");
    BOOST_TEST(batch.find("| `max_tokens` | integer | `8192` | 1 to 1073741824 |") !=
               std::string::npos);
    BOOST_TEST(batch.find("dataset") == std::string::npos);
    try {
        describe_deck("inferense");
        BOOST_FAIL("no error");
    } catch (const hymoe::Error& e) {
        BOOST_TEST((e.code() == hymoe::Exit::invalid));
        BOOST_TEST(std::string(e.what()).find("--describe-deck inferense: no such section") == 0);
    }
}

BOOST_AUTO_TEST_CASE(the_chat_choices_are_the_presets) {
    std::string row = describe_deck("tokenizer");
    row = row.substr(row.find("| `chat` |"));
    row = row.substr(0, row.find('\n'));
    std::string want = "`none`";
    for (const std::string& p : hymoe::text::kChatPresets)
        want += ", `" + p + "`";
    want += ", `template`";  // the model's own chat_template (text/chat.h)
    BOOST_TEST(row.find("| " + want + " |") != std::string::npos, row);
}

BOOST_AUTO_TEST_CASE(a_misspelt_section_is_an_unknown_key_at_its_line) {
    Folder f;
    BOOST_TEST(error_of("job: {kind: infer}\nmodel: {preset: tiny, init: random}\n"
                        "inferense: {dataset: p.jsonl}\n",
                        f.deck()) ==
               f.deck() +
                   ":3:1: inferense: unknown key (allowed: job, model, parallel, finetune, "
                   "inference, tokenizer, tokenize, profile, hardware, plan)");
}

BOOST_AUTO_TEST_CASE(a_map_valued_set_names_the_set_argument) {
    Folder f;
    const std::string deck =
        "job: {kind: infer}\nmodel: {preset: tiny, init: random}\ninference: {dataset: p.jsonl}\n";
    BOOST_TEST(error_of(deck, f.deck(), {"parallel={tp: 0}"}) ==
               "--set parallel={tp: 0}: parallel.tp: 0 is out of range (allowed: 1 to 1048576)");
    BOOST_TEST(error_of(deck, f.deck(), {"inference.batch={max_tokens: 8, prefill_chunk: 9}"}) ==
               "--set inference.batch={max_tokens: 8, prefill_chunk: 9}: "
               "inference.batch.prefill_chunk: 9 is larger than batch.max_tokens = 8");
    // a later --set of one key inside it names that one
    BOOST_TEST(error_of(deck, f.deck(), {"parallel={tp: 2}", "parallel.dp=0"}) ==
               "--set parallel.dp=0: parallel.dp: 0 is out of range (allowed: 1 to 1048576)");
}

BOOST_AUTO_TEST_SUITE_END()
