// HF tokenizer.json for byte-level BPE models (text/tokenizer.h). Supported: model BPE (vocab,
// merges as "a b" strings or [a, b] pairs, ignore_merges), normalizer none, pre_tokenizer Split
// (Regex or String pattern, behavior Isolated, not inverted) and ByteLevel (no prefix space; with
// use_regex the GPT-2 pattern), alone or in a Sequence, decoder ByteLevel, added_tokens. Anything
// else is an Exit::invalid error naming the field, rather than tokens that differ from HF's.
// Vocabulary strings are in GPT-2's byte-to-unicode alphabet and are mapped back to bytes here.
#include <set>

#include <nlohmann/json.hpp>

#include "hymoe/core/error.h"
#include "hymoe/text/tokenizer.h"

namespace hymoe::text {

namespace {

using nlohmann::json;

constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// GPT-2 bytes_to_unicode inverted: code point -> byte (−1: not in the alphabet). Printable
// Latin-1 bytes stand for themselves, the other 68 bytes for U+0100 onwards, in byte order.
std::vector<int> unicode_to_byte() {
    std::vector<int> inv(512, -1);
    int next = 256;
    for (int b = 0; b < 256; ++b) {
        const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
        inv[static_cast<size_t>(printable ? b : next++)] = b;
    }
    return inv;
}

// A vocabulary string back to bytes; false when it has a character outside the alphabet.
bool to_bytes(const std::string& s, const std::vector<int>& inv, std::string& out) {
    out.clear();
    for (size_t i = 0; i < s.size();) {
        const auto c = static_cast<uint8_t>(s[i]);
        uint32_t cp = 0;
        if (c < 0x80)
            cp = c, i += 1;
        else if ((c & 0xE0) == 0xC0 && i + 1 < s.size())
            cp = (c & 0x1Fu) << 6 | (static_cast<uint8_t>(s[i + 1]) & 0x3Fu), i += 2;
        else
            return false;
        if (cp >= inv.size() || inv[cp] < 0)
            return false;
        out += static_cast<char>(inv[cp]);
    }
    return true;
}

struct Ctx {
    const std::string& path;
    [[noreturn]] void fail(const std::string& field, const std::string& what) const {
        HYMOE_FAIL(Exit::invalid, path, ": ", field, ": ", what);
    }
};

void read_pretokenizer(const json& p, Tokenizer& tok, const Ctx& c, const std::string& field) {
    if (p.is_null())
        return;
    const std::string type = p.value("type", "");
    if (type == "Sequence") {
        const json& list = p.at("pretokenizers");
        for (size_t i = 0; i < list.size(); ++i)
            read_pretokenizer(list.at(i), tok, c, cat(field, ".pretokenizers[", i, "]"));
    } else if (type == "Split") {
        if (p.value("behavior", "") != "Isolated" || p.value("invert", false))
            c.fail(field, "only Split with behavior Isolated and invert false is supported");
        const json& pat = p.at("pattern");
        if (pat.contains("Regex")) {
            tok.add_pretokenizer(pat["Regex"].get<std::string>());
        } else if (pat.contains("String")) {
            std::string lit;
            for (char ch : pat["String"].get<std::string>()) {
                if (static_cast<unsigned char>(ch) < 0x80 &&
                    !std::isalnum(static_cast<unsigned char>(ch)))
                    lit += '\\';
                lit += ch;
            }
            tok.add_pretokenizer(lit);
        } else {
            c.fail(field + ".pattern", "expected {\"Regex\": ...} or {\"String\": ...}");
        }
    } else if (type == "ByteLevel") {
        if (p.value("add_prefix_space", false))
            c.fail(field, "ByteLevel with add_prefix_space is not supported");
        if (p.value("use_regex", true))
            tok.add_pretokenizer(kGpt2Pattern);
    } else {
        c.fail(field,
               "pre-tokenizer type '" + type + "' is not supported (Split, ByteLevel, Sequence)");
    }
}

// A token id of the file: an integer in 0 .. kMaxTokenId.
int32_t token_id(const json& id, const Ctx& c, const std::string& field) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > kMaxTokenId)
        c.fail(field, cat("token id ", id.dump(), " is not an integer from 0 to ", kMaxTokenId));
    return static_cast<int32_t>(id.get<int64_t>());
}

Tokenizer parse_tokenizer_json(const std::string& text, const Ctx& c);

}  // namespace

// The file's shape is checked as it is read: a key of the wrong JSON type or missing (json's own
// exceptions) is one Exit::invalid error naming the file.
Tokenizer parse_hf_tokenizer(const std::string& text, const std::string& path) {
    const Ctx c{path};
    try {
        return parse_tokenizer_json(text, c);
    } catch (const json::exception& e) {
        c.fail("(file)", cat("not a tokenizer.json of the expected shape (", e.what(), ")"));
    }
}

namespace {

Tokenizer parse_tokenizer_json(const std::string& text, const Ctx& c) {
    json j = json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object())
        c.fail("(file)", "not a JSON object");
    const json& model = j["model"];
    if (!model.is_object() || model.value("type", "BPE") != "BPE")
        c.fail("model.type", "only BPE models are supported");
    if (!model.contains("vocab") || !model["vocab"].is_object())
        c.fail("model.vocab", "missing");
    const json& norm = j.value("normalizer", json());
    if (!norm.is_null() &&
        !(norm.value("type", "") == "Sequence" && norm.at("normalizers").empty()))
        c.fail("normalizer", "normalizers are not supported");
    const json& dec = j.value("decoder", json());
    if (!dec.is_null() && dec.value("type", "") != "ByteLevel")
        c.fail("decoder", "only the ByteLevel decoder is supported");

    Tokenizer tok;
    const std::vector<int> inv = unicode_to_byte();
    std::set<std::string> added;  // their vocab entries (if any) are not byte-level strings
    for (const auto& a : j.value("added_tokens", json::array()))
        added.insert(a.at("content").get<std::string>());
    std::string bytes;
    for (const auto& [s, id] : model["vocab"].items()) {
        if (added.contains(s))
            continue;
        if (!to_bytes(s, inv, bytes))
            c.fail("model.vocab",
                   "'" + s + "' is not in the byte-level alphabet (not byte-level BPE)");
        tok.add_token(bytes, token_id(id, c, "model.vocab"));
    }
    const json& merges = model.value("merges", json::array());
    std::string left, right;
    for (size_t r = 0; r < merges.size(); ++r) {
        std::string a, b;
        if (merges[r].is_string()) {
            const std::string m = merges[r].get<std::string>();
            const size_t sp = m.find(' ', 1);
            if (sp == std::string::npos)
                c.fail(cat("model.merges[", r, "]"), "expected 'left right'");
            a = m.substr(0, sp), b = m.substr(sp + 1);
        } else {
            a = merges[r].at(0).get<std::string>(), b = merges[r].at(1).get<std::string>();
        }
        const auto& vocab = model["vocab"];
        if (!vocab.contains(a) || !vocab.contains(b))
            c.fail(cat("model.merges[", r, "]"),
                   "'" + a + " " + b + "' uses a token not in the vocabulary");
        tok.add_merge(token_id(vocab[a], c, "model.vocab"),
                      token_id(vocab[b], c, "model.vocab"),
                      static_cast<int32_t>(r));
    }
    tok.set_ignore_merges(model.value("ignore_merges", false));
    read_pretokenizer(j.value("pre_tokenizer", json()), tok, c, "pre_tokenizer");
    for (const auto& a : j.value("added_tokens", json::array()))
        tok.add_special(
            {a.at("content").get<std::string>(), token_id(a.at("id"), c, "added_tokens")});
    tok.set_kind("HF byte-level BPE");
    tok.finish();
    return tok;
}

}  // namespace

}  // namespace hymoe::text
