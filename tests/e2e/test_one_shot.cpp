// The one-shot hymoe --model/--prompt (runtime/prompt.h) and the deck defaults of the request
// options stop, stop_token_ids and n (inference.sampling): the text streamed to stdout equals
// results.h5's output_text of the same request run through a deck, greedily; a request without
// the options inherits the deck's, and a request's own value (even an empty list) wins.
#include <filesystem>
#include <fstream>

#include <boost/test/unit_test.hpp>

#include "hymoe/io/h5.h"
#include "run_binary.h"

namespace fs = std::filesystem;
using hymoe::testing::run_hymoe;

namespace {

const std::string kTok = "inputs/tokenizers/bytes/bytes.tiktoken";

bool contains(const std::string& s, const std::string& part) {
    return s.find(part) != std::string::npos;
}

struct TempDir {
    fs::path dir = fs::temp_directory_path() / ("hymoe_one_shot_" + std::to_string(::getpid()));
    TempDir() {
        fs::remove_all(dir);
        fs::create_directories(dir);
    }
    ~TempDir() { fs::remove_all(dir); }
    std::string file(const std::string& name, const std::string& text) const {
        std::ofstream((dir / name).string()) << text;
        return (dir / name).string();
    }
};

}  // namespace

BOOST_AUTO_TEST_SUITE(one_shot)

BOOST_AUTO_TEST_CASE(prompt_streams_the_decks_greedy_text) {
    TempDir t;
    const std::string prompt = "The quick brown fox";
    auto r = run_hymoe("--model tiny --tokenizer " + kTok + " --prompt '" + prompt +
                       "' --max-tokens 12 --set tokenizer.pattern='\\s+|\\S+'");
    BOOST_REQUIRE_MESSAGE(r.code == 0, r.err);
    const std::string deck =
        t.file("deck.yaml",
               "job: {kind: infer, output: " + (t.dir / "out").string() +
                   "}\nmodel: {preset: tiny, init: random}\ntokenizer: {path: " +
                   fs::absolute(kTok).string() + ", pattern: '\\s+|\\S+'}\ninference: {dataset: " +
                   t.file("r.jsonl", "{\"id\": \"prompt\", \"text\": \"" + prompt + "\"}\n") +
                   ", max_new_tokens: 12, sampling: {temperature: 0}}\n");
    auto d = run_hymoe(deck);
    BOOST_REQUIRE_MESSAGE(d.code == 0, d.err);
    hymoe::io::H5Reader h5((t.dir / "out/results.h5").string());
    const std::string text = h5.strings("/requests/output_text").at(0);
    BOOST_TEST(h5.ints("/requests/output_tokens").size() == 12u);
    BOOST_TEST(!text.empty());
    BOOST_TEST(r.out == text + "\n");  // stdout holds the text only (the log is not there)
    const auto err = r.err_lines();
    BOOST_REQUIRE(err.size() == 1u);
    BOOST_TEST(contains(err[0], " prompt tokens, 12 generated (finish length) in "), err[0]);
}

// --chat: the prompt as a user message through the folder's own chat_template (Jinja), which
// here writes what a deck's roles write; the two runs generate the same text.
BOOST_AUTO_TEST_CASE(chat_prompt_goes_through_the_models_template) {
    TempDir t;
    fs::create_directories(t.dir / "tok");
    fs::copy_file(kTok, t.dir / "tok/bytes.tiktoken");
    t.file("tok/tokenizer_config.json",
           R"({"chat_template": "{% for m in messages %}{{ m.role | upper }}: )"
           R"({{ m.content | trim }}{{ '\\n' }}{% endfor %})"
           R"({% if add_generation_prompt %}ASSISTANT:{% endif %}"})");
    auto r = run_hymoe("--model tiny --tokenizer " + (t.dir / "tok/bytes.tiktoken").string() +
                       " --chat --prompt ' Hi there ' --max-tokens 6");
    BOOST_REQUIRE_MESSAGE(r.code == 0, r.err);
    const std::string deck =
        t.file("deck.yaml",
               "job: {kind: infer, output: " + (t.dir / "out").string() +
                   "}\nmodel: {preset: tiny, init: random}\ntokenizer: {path: " +
                   (t.dir / "tok/bytes.tiktoken").string() +
                   ", roles: {user: {prefix: 'USER: ', suffix: \"\\n\"}}, generation_prefix: "
                   "'ASSISTANT:'}\ninference: {dataset: " +
                   t.file("r.jsonl",
                          "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi there\"}]}\n") +
                   ", max_new_tokens: 6, sampling: {temperature: 0}}\n");
    auto d = run_hymoe(deck);
    BOOST_REQUIRE_MESSAGE(d.code == 0, d.err);
    hymoe::io::H5Reader h5((t.dir / "out/results.h5").string());
    BOOST_TEST(h5.ints("/requests/prompt_len").at(0) == 25);  // "USER: Hi there\nASSISTANT:"
    BOOST_TEST(r.out == h5.strings("/requests/output_text").at(0) + "\n");
    BOOST_TEST(contains(r.err, "25 prompt tokens, 6 generated"), r.err);
}

BOOST_AUTO_TEST_CASE(prompt_errors) {
    auto r = run_hymoe("--model tiny --prompt hi");
    BOOST_TEST(r.code == 2);
    BOOST_TEST(r.err_lines().at(0) ==
               "--model tiny is a preset with random weights and no tokenizer: give --tokenizer "
               "PATH");
    r = run_hymoe("--model no/such/dir --prompt hi");
    BOOST_TEST(r.code == 2);
    BOOST_TEST(contains(r.err, "--model no/such/dir: neither a model folder nor a preset (tiny,"),
               r.err);
    r = run_hymoe("--prompt hi");
    BOOST_TEST(r.code == 2);
    BOOST_TEST(contains(r.err, "--model and --prompt go together"), r.err);
    r = run_hymoe("--model tiny --prompt hi --max-tokens x");
    BOOST_TEST(r.code == 2);
    BOOST_TEST(contains(r.err, "--max-tokens needs a number from 0 to 16777216, not 'x'"), r.err);
}

BOOST_AUTO_TEST_CASE(requests_inherit_the_decks_stop_and_n) {
    TempDir t;
    auto run = [&](const std::string& name, const std::string& lines, const std::string& sets) {
        fs::remove_all(t.dir / "out");
        return run_hymoe("tests/decks/infer/deck.yaml --set inference.dataset=" +
                         t.file(name, lines) + " --set job.output=" + (t.dir / "out").string() +
                         " --set inference.max_new_tokens=8" + sets);
    };
    // a seed of their own: a and b draw alike whatever their place in the file
    const std::string plain = "{\"id\": \"a\", \"tokens\": [5, 6, 7], \"seed\": 3}\n";
    auto r = run("plain.jsonl", plain, "");
    BOOST_REQUIRE_MESSAGE(r.code == 0, r.err);
    const auto full =
        hymoe::io::H5Reader((t.dir / "out/results.h5").string()).ints("/requests/output_tokens");
    BOOST_REQUIRE(full.size() == 8u);
    // a (no options): the deck's n = 3 and stop token full[3]; b: its own n and its own empty
    // stop_token_ids
    const std::string own =
        "{\"id\": \"b\", \"tokens\": [5, 6, 7], \"seed\": 3, \"n\": 1, \"stop_token_ids\": "
        "[]}\n";
    r = run("both.jsonl",
            plain + own,
            " --set inference.sampling.n=3 --set inference.sampling.stop_token_ids=[" +
                std::to_string(full[3]) + "]");
    BOOST_REQUIRE_MESSAGE(r.code == 0, r.err);
    hymoe::io::H5Reader h5((t.dir / "out/results.h5").string());
    BOOST_TEST(h5.strings("/requests/id") == (std::vector<std::string>{"a", "a", "a", "b"}),
               boost::test_tools::per_element());
    const auto tokens = h5.ints("/requests/output_tokens");
    const auto off = h5.ints("/requests/output_offsets");
    const auto finish = h5.strings("/requests/finish_reason");
    // sample 0 of a is the n = 1 run cut at the first full[3]
    const auto first = std::find(full.begin(), full.end(), full[3]) - full.begin();
    BOOST_TEST(std::vector<int64_t>(tokens.begin(), tokens.begin() + off[1]) ==
               std::vector<int64_t>(full.begin(), full.begin() + first + 1));
    BOOST_TEST(finish[0] == "stop");
    for (size_t i = 0; i < 3; ++i)  // every sample of a ends at the deck's stop token or length
        BOOST_TEST(
            (finish[i] == "length" || tokens[static_cast<size_t>(off[i + 1] - 1)] == full[3]));
    BOOST_TEST(std::vector<int64_t>(tokens.begin() + off[3], tokens.begin() + off[4]) == full);
    BOOST_TEST(finish[3] == "length");
    // the deck's defaults are checked when the deck loads
    r = run("plain.jsonl", plain, " --set inference.sampling.stop_token_ids=[100000]");
    BOOST_TEST(r.code == 2);
    BOOST_TEST(contains(r.err,
                        "inference.sampling.stop_token_ids: 100000 is outside the model's "
                        "vocabulary of 256 (model.preset: tiny)"),
               r.err);
    r = run("plain.jsonl", plain, " --set inference.sampling.stop=[x]");
    BOOST_TEST(r.code == 2);
    BOOST_TEST(contains(r.err, "inference.sampling.stop: stop strings need a tokenizer"), r.err);
}

BOOST_AUTO_TEST_SUITE_END()
