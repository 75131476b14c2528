// Text in and text out through the binary: the tokenize job (tests/decks/tokenize: a Kimi-style
// tokenizer folder, text, prompt/completion and chat lines) writes /tokens, /offsets and
// /loss_mask equal to the library's encoding with the prompt and non-assistant parts masked, the
// same on 2 ranks as on 1, resumes from its chunks, and names bad lines by file and line
// (fail: exit 3; skip: left out); an infer job (tests/decks/text) takes text and chat requests and
// writes the generated text beside the tokens in results.h5; stop strings and stop token ids end
// a request there (results.h5's stop columns, results.jsonl's stop_reason).
#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>

#include <boost/test/unit_test.hpp>
#include <nlohmann/json.hpp>

#include "hymoe/io/h5.h"
#include "hymoe/text/chat.h"
#include "hymoe/text/tokenizer.h"
#include "hymoe/text/utf8.h"
#include "run_binary.h"

namespace fs = std::filesystem;
using namespace hymoe;
using testing::read_text;
using testing::run_hymoe;

namespace {

const std::string kDir = "tests/decks/tokenize";
const std::string kDeck = kDir + "/deck.yaml";
const std::string kOut = kDir + "/out";

bool contains(const std::string& s, const std::string& part) {
    return s.find(part) != std::string::npos;
}

struct Dataset {
    std::vector<int64_t> tokens, offsets, mask, line;
};

Dataset read_dataset(const std::string& path) {
    io::H5Reader r(path);
    return {r.ints("/tokens"), r.ints("/offsets"), r.ints("/loss_mask"), r.ints("/line")};
}

// What the tokenize job must write for tests/decks/tokenize/data.jsonl, from the library.
Dataset expected() {
    const text::Tokenizer tok = text::load_tokenizer(kDir + "/tokenizer");
    const int32_t eos = tok.special_id("<|im_end|>");
    Dataset d;
    d.offsets.push_back(0);
    auto add = [&](const std::string& s, bool target) {
        for (int32_t id : tok.encode(s))
            d.tokens.push_back(id), d.mask.push_back(target);
    };
    auto end_doc = [&](int64_t line) {
        d.offsets.push_back(static_cast<int64_t>(d.tokens.size()));
        d.line.push_back(line);
    };
    add("the hello thing", true), add("<|im_end|>", true), end_doc(1);
    add("Say hello: ", false), add("hello there", true), d.tokens.push_back(eos),
        d.mask.push_back(1), end_doc(2);
    add("<|im_system|>system<|im_middle|>", false), add("Be kind.<|im_end|>", false);
    add("<|im_user|>user<|im_middle|>", false), add("hi<|im_end|>", false);
    add("<|im_assistant|>assistant<|im_middle|>", false), add("hello<|im_end|>", true), end_doc(4);
    add("漢字 and emoji 😀<|im_end|>", true), add("<|im_end|>", true), end_doc(5);
    add("in the end, the thing", true), add("<|im_end|>", true), end_doc(6);
    return d;
}

void check_equal(const Dataset& a, const Dataset& b) {
    BOOST_TEST(a.tokens == b.tokens);
    BOOST_TEST(a.offsets == b.offsets);
    BOOST_TEST(a.mask == b.mask);
    BOOST_TEST(a.line == b.line);
}

void write_file(const std::string& path, const std::string& text) {
    std::ofstream(path, std::ios::binary) << text;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(text_jobs)

BOOST_AUTO_TEST_CASE(tokenize_writes_tokens_offsets_and_loss_masks) {
    fs::remove_all(kOut);
    auto r = run_hymoe(kDeck);
    BOOST_TEST_REQUIRE(r.code == 0, r.err);
    const Dataset got = read_dataset(kOut + "/tokens.h5");
    check_equal(got, expected());
    BOOST_TEST(got.tokens.size() > 40u);
    BOOST_TEST(!fs::exists(kOut + "/tokens.h5.parts"));
    BOOST_TEST(contains(read_text(kOut + "/log"), "5 documents and"));
    io::H5Reader h5(kOut + "/tokens.h5");
    BOOST_TEST(h5.text("/meta/deck") == read_text(kDeck));
}

BOOST_AUTO_TEST_CASE(tokenize_on_2_ranks_equals_1_rank) {
    fs::remove_all(kOut);
    auto r = run_hymoe(kDeck + " --set parallel.dp=2", 2);
    BOOST_TEST_REQUIRE(r.code == 0, r.err);
    check_equal(read_dataset(kOut + "/tokens.h5"), expected());
}

BOOST_AUTO_TEST_CASE(tokenize_names_bad_lines) {
    fs::remove_all(kOut);
    fs::create_directories(kOut);
    const std::string bad = kOut + "/bad.jsonl";
    write_file(bad,
               "{\"text\": \"fine\"}\n{\"text\": \"caf\xe9\"}\n{\"text\": \"a <|nope|> b\"}\n"
               "{\"txt\": \"x\"}\n{\"text\": \"" +
                   std::string(100, 'x') + "\"}\n{\"text\": \"also fine\"}\n");
    const std::string set = " --set tokenize.dataset=" + fs::absolute(bad).string() +
                            " --set tokenize.max_line_bytes=64";
    auto r = run_hymoe(kDeck + set);
    BOOST_TEST(r.code == 3);
    BOOST_TEST(contains(r.err, "bad.jsonl:2: invalid UTF-8 at byte 13 of the line"), r.err);
    r = run_hymoe(kDeck + set + " --set tokenize.on_bad_request=skip");
    BOOST_TEST_REQUIRE(r.code == 0, r.err);
    const std::string log = read_text(kOut + "/log");
    BOOST_TEST(contains(log, "bad.jsonl:3: unknown special token '<|nope|>' (skipped)"));
    BOOST_TEST(contains(log, "bad.jsonl:4: expected \"text\""));
    BOOST_TEST(contains(log, "bad.jsonl:5: the line has 112 bytes, more than"));
    BOOST_TEST(read_dataset(kOut + "/tokens.h5").line == (std::vector<int64_t>{1, 6}));
}

// A failed run leaves its finished chunks; the rerun (same deck) keeps them and equals a fresh run.
BOOST_AUTO_TEST_CASE(tokenize_resumes_from_its_chunks) {
    fs::remove_all(kOut);
    fs::create_directories(kOut);
    const std::string data = kOut + "/data.jsonl";
    std::string good = read_text(kDir + "/data.jsonl");
    std::string broken = good;
    broken.replace(broken.rfind("in the end"), 2, "\xff\xfe");  // line 6 (chunk 2) invalid
    write_file(data, broken);
    const std::string set = " --set tokenize.dataset=" + fs::absolute(data).string();
    auto r = run_hymoe(kDeck + set);
    BOOST_TEST_REQUIRE(r.code == 3);
    BOOST_TEST(fs::exists(kOut + "/tokens.h5.parts/chunk-00000001.h5"));
    write_file(data, good);
    r = run_hymoe(kDeck + set);
    BOOST_TEST_REQUIRE(r.code == 0, r.err);
    BOOST_TEST(contains(read_text(kOut + "/log"), "2 chunks resumed"));
    check_equal(read_dataset(kOut + "/tokens.h5"), expected());
}

BOOST_AUTO_TEST_CASE(infer_takes_text_and_chat_and_writes_text) {
    const std::string dir = "tests/decks/text";
    fs::remove_all(dir + "/out");
    auto r = run_hymoe(dir + "/deck.yaml");
    BOOST_TEST_REQUIRE(r.code == 0, r.err);
    const std::string log = read_text(dir + "/out/log");
    BOOST_TEST(contains(log, "requests.jsonl:4: invalid UTF-8 at byte 27 of the line (skipped)"));
    BOOST_TEST(contains(log, "requests.jsonl:5: unknown special token '<|nope|>' (skipped)"));
    io::H5Reader h5(dir + "/out/results.h5");
    BOOST_TEST(h5.strings("/requests/id") == (std::vector<std::string>{"t1", "c1", "k1", "t2"}));
    // byte tokens: the prompt length is the text's (or rendered chat's) length in bytes
    const std::string chat = "User: 2+2?\nAssistant:";
    BOOST_TEST(h5.ints("/requests/prompt_len") ==
               (std::vector<int64_t>{11, static_cast<int64_t>(chat.size()), 2, 15}));
    const text::Tokenizer tok = text::load_tokenizer(dir + "/bytes.tiktoken", "\\s+|\\S+");
    const auto out = h5.ints("/requests/output_tokens");
    const auto off = h5.ints("/requests/output_offsets");
    const auto texts = h5.strings("/requests/output_text");
    BOOST_TEST_REQUIRE(texts.size() == 4u);
    for (size_t i = 0; i < 4; ++i) {
        std::vector<int32_t> ids(out.begin() + off[i], out.begin() + off[i + 1]);
        BOOST_TEST(!ids.empty());
        BOOST_TEST(texts[i] == text::utf8_sanitize(tok.decode(ids)));
    }
}

// Stops through the binary (byte tokens: a token's bytes are one byte): a stop string of two
// bytes from the greedy output ends it at the token completing its first occurrence,
// the text cut before it; a stop token id ends it at that token's first occurrence; the H5 stop
// columns and results.jsonl's stop_reason say which; "stop" without a tokenizer is a bad request.
BOOST_AUTO_TEST_CASE(stop_strings_and_stop_token_ids_through_the_binary) {
    const std::string dir = fs::absolute("tests/decks/text").string();
    const std::string out = dir + "/out-stop";
    fs::remove_all(out);
    fs::create_directories(out);
    auto run = [&](const std::string& name, const std::string& lines) {
        std::ofstream(out + "/" + name) << lines;
        return run_hymoe(dir + "/deck.yaml --set inference.dataset=" + out + "/" + name +
                         " --set job.output=" + out + "/" + name + ".out" +
                         " --set inference.max_new_tokens=24");
    };
    BOOST_REQUIRE(run("free.jsonl", "{\"text\": \"hello world\"}\n").code == 0);
    const auto free =
        io::H5Reader(out + "/free.jsonl.out/results.h5").ints("/requests/output_tokens");
    BOOST_REQUIRE(free.size() == 24u);
    std::string bytes;  // the byte tokenizer: token t is byte t
    for (int64_t t : free)
        bytes += static_cast<char>(t);
    // two bytes that are valid UTF-8 as they are (two letters, or a 2-byte character), past the
    // first token: a stop string spanning two tokens
    auto fits = [&](size_t i) {
        const auto a = static_cast<unsigned char>(bytes[i]);
        const auto b = static_cast<unsigned char>(bytes[i + 1]);
        const bool letters = std::isalpha(a) && std::isalpha(b);
        return letters || (a >= 0xC2 && a <= 0xDF && b >= 0x80 && b <= 0xBF);
    };
    size_t k = 1;
    while (k + 1 < bytes.size() && !fits(k))
        ++k;
    BOOST_REQUIRE(k + 1 < bytes.size());
    const std::string stop = bytes.substr(k, 2);
    const size_t at = bytes.find(stop);
    const size_t first = std::find(free.begin(), free.end(), free[3]) - free.begin();
    const auto r = run("stop.jsonl",
                       "{\"text\": \"hello world\", \"stop\": [\"" + stop +
                           "\"]}\n{\"text\": \"hello world\", \"stop_token_ids\": [" +
                           std::to_string(free[3]) + "]}\n");
    BOOST_REQUIRE_MESSAGE(r.code == 0, r.err);
    io::H5Reader h5(out + "/stop.jsonl.out/results.h5");
    const auto tokens = h5.ints("/requests/output_tokens");
    const auto off = h5.ints("/requests/output_offsets");
    BOOST_TEST(h5.strings("/requests/finish_reason") == (std::vector<std::string>{"stop", "stop"}),
               boost::test_tools::per_element());
    BOOST_TEST(h5.strings("/requests/stop_string") == (std::vector<std::string>{stop, ""}),
               boost::test_tools::per_element());
    BOOST_TEST(h5.ints("/requests/stop_token") == (std::vector<int64_t>{-1, free[3]}),
               boost::test_tools::per_element());
    BOOST_TEST(std::vector<int64_t>(tokens.begin(), tokens.begin() + off[1]) ==
                   std::vector<int64_t>(free.begin(), free.begin() + at + 2),
               boost::test_tools::per_element());
    BOOST_TEST(std::vector<int64_t>(tokens.begin() + off[1], tokens.end()) ==
                   std::vector<int64_t>(free.begin(), free.begin() + first + 1),
               boost::test_tools::per_element());
    const auto texts = h5.strings("/requests/output_text");
    BOOST_TEST(texts[0] == text::utf8_sanitize(bytes.substr(0, at)));
    std::ifstream jsonl(out + "/stop.jsonl.out/results.jsonl");
    std::string line;
    std::getline(jsonl, line);
    BOOST_TEST(nlohmann::json::parse(line)["outputs"][0]["stop_reason"] == stop);
    std::getline(jsonl, line);
    BOOST_TEST(nlohmann::json::parse(line)["outputs"][0]["stop_reason"] == free[3]);

    std::ofstream(out + "/nostop.jsonl") << "{\"tokens\": [5, 6], \"stop\": \"ab\"}\n";
    const auto bad = run_hymoe("tests/decks/infer/deck.yaml --set inference.dataset=" + out +
                               "/nostop.jsonl --set job.output=" + out + "/nostop.out");
    BOOST_TEST(bad.code == 3);
    BOOST_TEST(contains(bad.err, "nostop.jsonl:1: \"stop\" strings need a tokenizer"), bad.err);
    fs::remove_all(out);
}

BOOST_AUTO_TEST_SUITE_END()
