// Exactness against a real peer: the npm package `tiktoken` (OpenAI's tokenizer as WASM, run by
// node through tests/text/tiktoken_peer.cjs) encodes the multilingual corpus of tests/text/corpus.h
// with cl100k_base and o200k_base; hymoe loads the rank files the script writes from the package's
// own data and must produce the same ids for every document, and decode(encode(x)) == x; so must
// the same ranks converted to a tokenizer.json (the merge-list path).
// Needs node and build/node/node_modules/tiktoken (`make deps` installs both).
#include <algorithm>
#include <filesystem>
#include <map>
#include <sstream>
#include <unordered_map>

#include <boost/test/unit_test.hpp>
#include <nlohmann/json.hpp>

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

// GPT-2's byte-to-unicode alphabet (tokenizer.json vocabularies are written in it).
std::string byte_level(const std::string& bytes) {
    std::string s;
    for (unsigned char b : bytes) {
        int c = b;
        if (!((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE)) {
            c = 256;  // the n-th byte outside the printable ranges maps to U+0100 + n
            for (int x = 0; x < b; ++x)
                c += !((x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE);
        }
        if (c < 0x80)
            s += static_cast<char>(c);
        else
            s += static_cast<char>(0xC0 | c >> 6), s += static_cast<char>(0x80 | (c & 0x3F));
    }
    return s;
}

// A tokenizer.json equivalent to a tiktoken encoding, built the way HF converts tiktoken files:
// vocabulary = the ranks, merges = every split of every token into two tokens, ordered by the
// joined token's rank, pre-tokenizer Split(pattern) + ByteLevel without regex; ignore_merges off,
// so every piece goes through the merge list.
std::string tokenizer_json_of(const text::Tokenizer& tok,
                              int32_t n_ranks,
                              const std::string& pattern) {
    nlohmann::json vocab = nlohmann::json::object(), merges = nlohmann::json::array();
    std::unordered_map<std::string, int32_t> rank;
    for (int32_t id = 0; id < n_ranks; ++id) {
        rank[tok.token_bytes(id)] = id;
        vocab[byte_level(tok.token_bytes(id))] = id;
    }
    for (int32_t id = 0; id < n_ranks; ++id) {
        const std::string& t = tok.token_bytes(id);
        std::vector<std::pair<int32_t, int32_t>> splits;
        for (size_t i = 1; i < t.size(); ++i) {
            auto l = rank.find(t.substr(0, i)), r = rank.find(t.substr(i));
            if (l != rank.end() && r != rank.end())
                splits.push_back({l->second, r->second});
        }
        std::sort(splits.begin(), splits.end());
        for (const auto& [l, r] : splits)
            merges.push_back(byte_level(tok.token_bytes(l)) + " " + byte_level(tok.token_bytes(r)));
    }
    nlohmann::json j = {
        {"normalizer", nullptr},
        {"pre_tokenizer",
         {{"type", "Sequence"},
          {"pretokenizers",
           {{{"type", "Split"},
             {"pattern", {{"Regex", pattern}}},
             {"behavior", "Isolated"},
             {"invert", false}},
            {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}}},
        {"model",
         {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}, {"ignore_merges", false}}},
        {"added_tokens", nlohmann::json::array()},
        {"decoder", {{"type", "ByteLevel"}}}};
    return j.dump();
}

const Peer& peer() {
    static Peer p;
    return p;
}

// The peer's ids for the corpus (encoded once per encoding).
const std::vector<std::vector<int32_t>>& peer_ids(const std::string& name) {
    static std::map<std::string, std::vector<std::vector<int32_t>>> ids;
    if (!ids.contains(name)) {
        const std::string out = kDir + "/" + name + ".ids";
        BOOST_TEST_REQUIRE(
            testing::run_peer("encode " + name + " " + kDir + "/corpus.docs " + out) == 0);
        ids[name] = testing::read_ids(out);
        BOOST_TEST_REQUIRE(ids[name].size() == peer().docs.size());
    }
    return ids[name];
}

void compare_with_peer(const std::string& name, const text::Tokenizer& tok) {
    const Peer& peer = ::peer();
    const auto& want = peer_ids(name);
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
    peer();
    compare_with_peer("cl100k_base",
                      text::load_tiktoken(kDir + "/cl100k_base.tiktoken", "cl100k_base"));
}

BOOST_AUTO_TEST_CASE(o200k_base_equals_npm_tiktoken) {
    peer();
    compare_with_peer("o200k_base",
                      text::load_tiktoken(kDir + "/o200k_base.tiktoken", "o200k_base"));
}

// The tokenizer.json path (merge list, Split + ByteLevel, byte-level vocabulary) at scale: the
// cl100k_base ranks converted to a tokenizer.json encode the corpus as npm tiktoken does.
BOOST_AUTO_TEST_CASE(cl100k_base_as_tokenizer_json_equals_npm_tiktoken) {
    peer();
    const std::string path = kDir + "/cl100k_base.tiktoken";
    const text::Tokenizer ranks = text::load_tiktoken(path, "cl100k_base");
    const int32_t n_ranks = 100256;
    const text::Tokenizer hf = text::parse_hf_tokenizer(
        tokenizer_json_of(ranks, n_ranks, text::tiktoken_preset_pattern("cl100k_base")),
        "cl100k_base.json");
    BOOST_TEST(hf.describe().find("HF byte-level BPE, 100256 tokens") == 0u);
    compare_with_peer("cl100k_base", hf);
}

// The built-in patterns and special tokens are the package's.
BOOST_AUTO_TEST_CASE(presets_equal_the_package) {
    peer();
    for (const std::string name : {"cl100k_base", "o200k_base"}) {
        std::istringstream out(
            testing::run_capture("node tests/text/tiktoken_peer.cjs pattern " + name));
        std::string pattern;
        std::getline(out, pattern);
        BOOST_TEST(pattern == text::tiktoken_preset_pattern(name));
        const text::Tokenizer tok = text::load_tiktoken(kDir + "/" + name + ".tiktoken", name);
        size_t n = 0;
        for (std::string special; out >> special; ++n) {
            int32_t id = -1;
            out >> id;
            BOOST_TEST(tok.special_id(special) == id, name << " " << special);
        }
        BOOST_TEST(n == tok.specials().size());
    }
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
