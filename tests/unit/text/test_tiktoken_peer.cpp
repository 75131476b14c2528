// Exactness against a real peer: the npm package `tiktoken` (OpenAI's tokenizer as WASM, run by
// node through tests/text/tiktoken_peer.cjs) encodes the multilingual corpus of tests/text/corpus.h
// with cl100k_base and o200k_base; hymoe loads the rank files the script writes from the package's
// own data and must produce the same ids for every document, and decode(encode(x)) == x.
// Needs node and build/node/node_modules/tiktoken (`make deps` installs both).
#include <filesystem>

#include <boost/test/unit_test.hpp>

#include "../../text/corpus.h"
#include "hymoe/text/tokenizer.h"

namespace fs = std::filesystem;
using namespace hymoe;

namespace {

const std::string kDir = "build/test-text";

struct Peer {
    std::vector<std::string> docs = testing::build_corpus();
    Peer() {
        fs::create_directories(kDir);
        BOOST_TEST_REQUIRE(testing::run_peer("files " + kDir) == 0,
                           "node tests/text/tiktoken_peer.cjs failed: is node installed and "
                           "build/node/node_modules/tiktoken there (make deps)?");
        testing::write_docs(kDir + "/corpus.docs", docs);
    }
};

void compare_with_peer(const std::string& name) {
    static Peer peer;
    BOOST_TEST_REQUIRE(testing::run_peer("encode " + name + " " + kDir + "/corpus.docs " + kDir +
                                         "/" + name + ".ids") == 0);
    const auto want = testing::read_ids(kDir + "/" + name + ".ids");
    BOOST_TEST_REQUIRE(want.size() == peer.docs.size());
    const text::Tokenizer tok = text::load_tiktoken(kDir + "/" + name + ".tiktoken", name);
    size_t bytes = 0, ids = 0, differ = 0, round_trip = 0;
    for (size_t d = 0; d < peer.docs.size(); ++d) {
        const std::vector<int32_t> got = tok.encode(peer.docs[d], false);
        bytes += peer.docs[d].size(), ids += want[d].size();
        if (got != want[d]) {
            ++differ;
            size_t i = 0;
            while (i < got.size() && i < want[d].size() && got[i] == want[d][i])
                ++i;
            BOOST_TEST_MESSAGE(
                name << ": document " << d << " differs at id " << i << " ('"
                     << tok.decode(want[d].data() + i, std::min<size_t>(4, want[d].size() - i))
                     << "')");
        }
        round_trip += tok.decode(got) != peer.docs[d];
    }
    BOOST_TEST_MESSAGE(name << ": " << peer.docs.size() << " documents, " << bytes << " bytes, "
                            << ids << " ids compared with npm tiktoken");
    BOOST_TEST(differ == 0u);
    BOOST_TEST(round_trip == 0u);
    BOOST_TEST(bytes > 2'000'000u);  // the corpus is large: the Debian files are there
}

}  // namespace

BOOST_AUTO_TEST_SUITE(text_peer)

BOOST_AUTO_TEST_CASE(cl100k_base_equals_npm_tiktoken) {
    compare_with_peer("cl100k_base");
}

BOOST_AUTO_TEST_CASE(o200k_base_equals_npm_tiktoken) {
    compare_with_peer("o200k_base");
}

// Special tokens written in the text (allowed_special "all" on the peer side).
BOOST_AUTO_TEST_CASE(special_tokens_equal_npm_tiktoken) {
    const std::vector<std::string> docs = {
        "<|endoftext|>Hello<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>  return "
        "1<|endofprompt|>",
        "no specials here, just <| text |> and <|endoftext",
        "<|endoftext|><|endoftext|>x<|endoftext|>"};
    fs::create_directories(kDir);
    BOOST_TEST_REQUIRE(testing::run_peer("files " + kDir) == 0);
    testing::write_docs(kDir + "/special.docs", docs);
    BOOST_TEST_REQUIRE(testing::run_peer("encode cl100k_base " + kDir + "/special.docs " + kDir +
                                         "/special.ids special") == 0);
    const auto want = testing::read_ids(kDir + "/special.ids");
    const text::Tokenizer tok = text::load_tiktoken(kDir + "/cl100k_base.tiktoken", "cl100k_base");
    BOOST_TEST_REQUIRE(want.size() == docs.size());
    for (size_t d = 0; d < docs.size(); ++d) {
        BOOST_TEST(tok.encode(docs[d], true) == want[d]);
        BOOST_TEST(tok.decode(want[d]) == docs[d]);
    }
}

BOOST_AUTO_TEST_SUITE_END()
