// Tokenizer pieces by hand: UTF-8 checks and U+FFFD substitution, streaming detokenisation against
// the whole text, a small HF tokenizer.json built here (merge order, Split regexes, added tokens,
// round trips), tiktoken rank files with Kimi's special tokens and Han pattern, the pattern
// translation to PCRE2, bad input messages and the chat presets.
#include <filesystem>
#include <fstream>
#include <random>

#include <boost/test/unit_test.hpp>
#include <nlohmann/json.hpp>

#include "hymoe/core/error.h"
#include "hymoe/text/chat.h"
#include "hymoe/text/tokenizer.h"
#include "hymoe/text/utf8.h"

namespace fs = std::filesystem;
using namespace hymoe;
using namespace hymoe::text;

namespace {

// GPT-2's byte-to-unicode alphabet, written out independently of src/text/hf_json.cpp.
std::string byte_char(int b) {
    static std::vector<int> cp = [] {
        std::vector<int> v(256, -1);
        int next = 256;
        for (int i = 0; i < 256; ++i)
            v[static_cast<size_t>(i)] =
                (i >= '!' && i <= '~') || (i >= 0xA1 && i <= 0xAC) || (i >= 0xAE) ? i : next++;
        return v;
    }();
    std::string s;
    const int c = cp[static_cast<size_t>(b)];
    if (c < 0x80)
        s += static_cast<char>(c);
    else
        s += static_cast<char>(0xC0 | c >> 6), s += static_cast<char>(0x80 | (c & 0x3F));
    return s;
}

// Bytes 0..255 are ids 0..255; merges (in this order) h e, l o, l l, he l, hel lo, Ġ w.
std::string small_tokenizer_json() {
    nlohmann::json vocab = nlohmann::json::object();
    for (int b = 0; b < 256; ++b)
        vocab[byte_char(b)] = b;
    const std::vector<std::pair<std::string, std::string>> merges = {
        {"h", "e"}, {"l", "o"}, {"l", "l"}, {"he", "l"}, {"hel", "lo"}, {byte_char(' '), "w"}};
    nlohmann::json m = nlohmann::json::array();
    int id = 256;
    for (const auto& [a, b] : merges) {
        vocab[a + b] = id++;
        m.push_back(a + " " + b);
    }
    vocab["<|eot|>"] = 262;
    nlohmann::json j = {
        {"version", "1.0"},
        {"normalizer", nullptr},
        {"pre_tokenizer",
         {{"type", "Sequence"},
          {"pretokenizers",
           {{{"type", "Split"},
             {"pattern", {{"Regex", "\\p{N}{1,3}"}}},
             {"behavior", "Isolated"},
             {"invert", false}},
            {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}}}}},
        {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", m}}},
        {"added_tokens",
         {{{"id", 262}, {"content", "<|eot|>"}, {"special", true}}}},  // in vocab too
        {"decoder", {{"type", "ByteLevel"}}}};
    return j.dump();
}

std::vector<int32_t> bytes_of(const std::string& s) {
    std::vector<int32_t> v;
    for (unsigned char c : s)
        v.push_back(c);
    return v;
}

std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const Error& e) {
        return cat(static_cast<int>(e.code()), " ", e.what());
    }
    return "no error";
}

}  // namespace

BOOST_AUTO_TEST_SUITE(text_tokenizer)

BOOST_AUTO_TEST_CASE(utf8_checks) {
    BOOST_TEST(utf8_first_invalid("plain ascii") == std::string::npos);
    BOOST_TEST(utf8_first_invalid("é€😀") == std::string::npos);
    BOOST_TEST(utf8_first_invalid("ab\xC0\xAF") == 2u);         // overlong '/'
    BOOST_TEST(utf8_first_invalid("a\xED\xA0\x80") == 1u);      // a surrogate
    BOOST_TEST(utf8_first_invalid("a\xF4\x90\x80\x80") == 1u);  // above U+10FFFF
    BOOST_TEST(utf8_first_invalid("a\xE2\x82") == 1u);          // cut short
    BOOST_TEST(utf8_incomplete_tail("a\xE2\x82") == 2u);
    BOOST_TEST(utf8_incomplete_tail("a\xF0\x9F\x98") == 3u);
    BOOST_TEST(utf8_incomplete_tail("a\xE2\x82\xAC") == 0u);
    BOOST_TEST(utf8_incomplete_tail("a\x82") == 0u);        // a stray continuation
    BOOST_TEST(utf8_incomplete_tail("a\xE0\x80") == 0u);    // can never complete
    BOOST_TEST(utf8_sanitize("a\xE2\x82z") == "a\uFFFDz");  // one maximal subpart
    BOOST_TEST(utf8_sanitize("\xF0\x80\x80") == "\uFFFD\uFFFD\uFFFD");
    BOOST_TEST(utf8_sanitize("\xC3") == "\uFFFD");
}

// Each piece released is valid UTF-8, and the pieces joined equal the whole output sanitised.
BOOST_AUTO_TEST_CASE(detokenizer_streams_whole_characters) {
    const Tokenizer tok = parse_hf_tokenizer(small_tokenizer_json(), "small.json");
    std::mt19937 rng(7);
    const std::string texts[] = {
        "héllo wörld € 😀 漢字", "\xF0\x9F\x98\x80\xE2\x82", "a\xE2\x82z\xF0\x80"};
    for (const std::string& t : texts) {
        std::vector<int32_t> ids = bytes_of(t);
        for (int trial = 0; trial < 20; ++trial) {
            Detokenizer d(tok);
            std::string joined;
            for (int32_t id : ids) {
                const std::string piece = d.push(id);
                BOOST_TEST(utf8_first_invalid(piece) == std::string::npos);
                joined += piece;
            }
            joined += d.finish();
            BOOST_TEST(joined == utf8_sanitize(tok.decode(ids)));
            std::shuffle(ids.begin(), ids.end(), rng);  // other byte orders, mostly invalid
        }
    }
    Detokenizer d(tok);  // a character split over two tokens comes out whole, once
    BOOST_TEST(d.push(0xE2) == "");
    BOOST_TEST(d.push(0x82) == "");
    BOOST_TEST(d.push(0xAC) == "€");
    BOOST_TEST(d.finish() == "");
}

// Merges by list order, hand-checked, where the joined token's id order would say otherwise.
BOOST_AUTO_TEST_CASE(hf_merges_in_list_order) {
    const Tokenizer tok = parse_hf_tokenizer(small_tokenizer_json(), "small.json");
    const int32_t he = 256, lo = 257, ll = 258, hello = 260, sp_w = 261;
    // h e l l o: he (rank 0), then l o (1) before l l (2), he l (3), hel lo (4)
    BOOST_TEST(tok.encode("hello") == (std::vector<int32_t>{hello}));
    // h e l l l l o: he, l o at the end, then the leftmost l l; nothing joins after that
    BOOST_TEST(tok.encode("hellllo") == (std::vector<int32_t>{he, ll, 'l', lo}));
    // the GPT-2 regex keeps the space with the word; digits are split in threes first
    BOOST_TEST(tok.encode("hello world") ==
               (std::vector<int32_t>{hello, sp_w, 'o', 'r', 'l', 'd'}));
    BOOST_TEST(tok.encode("12345") == bytes_of("12345"));
    BOOST_TEST(tok.encode("hi<|eot|>hello") == (std::vector<int32_t>{'h', 'i', 262, hello}));
    BOOST_TEST(tok.encode("hi<|eot|>", false) == bytes_of("hi<|eot|>"));
    for (const std::string s : {"héllo wörld", "漢字 😀\n\n  x", "<|eot|> hello<|eot|>", ""})
        BOOST_TEST(tok.decode(tok.encode(s)) == s);
    BOOST_TEST(tok.special_id("<|eot|>") == 262);
    BOOST_TEST(tok.n_vocab() == 263);
}

BOOST_AUTO_TEST_CASE(hf_unsupported_parts_are_named) {
    nlohmann::json j = nlohmann::json::parse(small_tokenizer_json());
    j["normalizer"] = {{"type", "NFC"}};
    BOOST_TEST(error_of([&] { parse_hf_tokenizer(j.dump(), "t.json"); }) ==
               "2 t.json: normalizer: normalizers are not supported");
    j = nlohmann::json::parse(small_tokenizer_json());
    j["model"]["vocab"]["▁x"] = 999;  // a character outside the byte-level alphabet
    BOOST_TEST(error_of([&] {
                   parse_hf_tokenizer(j.dump(), "t.json");
               }).find("not byte-level BPE") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(bad_text_messages) {
    const Tokenizer tok = parse_hf_tokenizer(small_tokenizer_json(), "small.json");
    BOOST_TEST(error_of([&] { tok.encode("abc\xFF"); }) == "3 invalid UTF-8 at byte 3");
    BOOST_TEST(error_of([&] { tok.encode("x <|nope|> y"); }) ==
               "3 unknown special token '<|nope|>'");
    BOOST_TEST(error_of([&] { tok.encode("<｜User｜>"); }) ==
               "3 unknown special token '<｜User｜>'");
    BOOST_TEST(tok.encode("<| spaced |>") == tok.encode("<| spaced |>", false));  // not a marker
    BOOST_TEST(error_of([&] {
                   tok.decode(std::vector<int32_t>{5, 263});
               }) == "3 token id 263 is outside the vocabulary [0, 263)");
}

// A Kimi-style model folder: rank file, tokenizer_config.json specials, reserved ids, Han runs.
BOOST_AUTO_TEST_CASE(tiktoken_folder_with_kimi_specials) {
    const fs::path dir = fs::path("build/test-text/kimi");
    fs::create_directories(dir);
    {
        std::ofstream ranks(dir / "tiktoken.model");
        const char* b64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        for (int b = 0; b < 256; ++b) {  // one byte: 2 sextets then "=="
            ranks << b64[b >> 2] << b64[(b & 3) << 4] << "== " << b << "\n";
        }
        ranks << "YWI= 256\n";  // "ab"
        std::ofstream cfg(dir / "tokenizer_config.json");
        cfg << R"({"added_tokens_decoder": {"257": {"content": "[BOS]", "special": true},
                  "258": {"content": "<|im_end|>", "special": true}}})";
    }
    const Tokenizer tok = load_tokenizer(dir.string());
    BOOST_TEST(tok.special_id("[BOS]") == 257);
    BOOST_TEST(tok.special_id("<|im_end|>") == 258);
    BOOST_TEST(tok.special_id("<|reserved_token_259|>") == 259);
    BOOST_TEST(tok.special_id("<|reserved_token_512|>") == 512);
    BOOST_TEST(tok.n_vocab() == 257 + 256);
    BOOST_TEST(tok.encode("ab[BOS]ab<|im_end|>") == (std::vector<int32_t>{256, 257, 256, 258}));
    // Han is its own piece under the Kimi pattern, so "字ab" does not join across it
    const std::string han = "漢字ab";
    std::vector<int32_t> want = bytes_of("漢字");
    want.push_back(256);
    BOOST_TEST(tok.encode(han) == want);
    // Kimi cuts a run of more than 25000 non-space characters: "b" + "ab" x 13000 is encoded as
    // its first 25000 characters, then the rest, so the pair at the cut is not joined
    std::string run = "b";
    for (int i = 0; i < 13000; ++i)
        run += "ab";
    std::vector<int32_t> cut = {'b'};
    cut.insert(cut.end(), 12499, 256);
    cut.push_back('a'), cut.push_back('b');
    cut.insert(cut.end(), 500, 256);
    BOOST_TEST(tok.encode(run) == cut);
    BOOST_TEST(tok.decode(tok.encode(run)) == run);
}

BOOST_AUTO_TEST_CASE(pattern_translation) {
    Regex letters_not_han("[\\p{L}&&[^\\p{Han}]]+");
    size_t b = 0, e = 0;
    BOOST_TEST(letters_not_han.find("漢字abc", 0, b, e));
    BOOST_TEST(b == 6u);
    BOOST_TEST(e == 9u);
    Regex space("\\s+");  // U+0085 is White_Space, as in Rust's regex
    BOOST_TEST(space.find("a\u0085b", 0, b, e));
    BOOST_TEST(b == 1u);
    BOOST_TEST(e == 3u);
    Regex not_space("[^\\s]+");
    BOOST_TEST(not_space.find("\u3000x\u3000", 0, b, e));
    BOOST_TEST(b == 3u);
    BOOST_TEST(error_of([] { Regex r("(ab"); }).find("does not compile") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(chat_presets) {
    const std::vector<ChatMessage> m = {
        {"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello."}, {"user", "2+2?"}};
    BOOST_TEST(render_chat(chat_preset("kimi"), m) ==
               "<|im_system|>system<|im_middle|>Be brief.<|im_end|>"
               "<|im_user|>user<|im_middle|>Hi<|im_end|>"
               "<|im_assistant|>assistant<|im_middle|>Hello.<|im_end|>"
               "<|im_user|>user<|im_middle|>2+2?<|im_end|>"
               "<|im_assistant|>assistant<|im_middle|>");
    BOOST_TEST(render_chat(chat_preset("deepseek"), m) ==
               "<｜begin▁of▁sentence｜>Be brief.<｜User｜>Hi<｜Assistant｜></think>Hello."
               "<｜end▁of▁sentence｜><｜User｜>2+2?<｜Assistant｜></think>");
    const auto pieces = chat_pieces(chat_preset("kimi"), m);
    int targets = 0;
    for (const auto& p : pieces)
        targets += p.target;
    BOOST_TEST(targets == 1);
    BOOST_TEST(error_of([&] {
                   chat_pieces(chat_preset("kimi"), {{"tool", "x"}});
               }) == "3 message role 'tool' is not in the chat template");
    BOOST_TEST(error_of([] { chat_preset("llama"); }) ==
               "2 unknown chat preset 'llama' (kimi, deepseek)");
}

BOOST_AUTO_TEST_SUITE_END()
