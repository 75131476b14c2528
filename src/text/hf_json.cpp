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
        for (size_t i = 0; i < p["pretokenizers"].size(); ++i)
            read_pretokenizer(p["pretokenizers"][i], tok, c, cat(field, ".pretokenizers[", i, "]"));
    } else if (type == "Split") {
        if (p.value("behavior", "") != "Isolated" || p.value("invert", false))
            c.fail(field, "only Split with behavior Isolated and invert false is supported");
        const json& pat = p["pattern"];
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

}  // namespace

Tokenizer parse_hf_tokenizer(const std::string& text, const std::string& path) {
    const Ctx c{path};
    json j = json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object())
        c.fail("(file)", "not a JSON object");
    const json& model = j["model"];
    if (!model.is_object() || model.value("type", "BPE") != "BPE")
        c.fail("model.type", "only BPE models are supported");
    if (!model.contains("vocab") || !model["vocab"].is_object())
        c.fail("model.vocab", "missing");
    const json& norm = j.value("normalizer", json());
    if (!norm.is_null() && !(norm.value("type", "") == "Sequence" && norm["normalizers"].empty()))
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
        tok.add_token(bytes, id.get<int32_t>());
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
        tok.add_merge(vocab[a].get<int32_t>(), vocab[b].get<int32_t>(), static_cast<int32_t>(r));
    }
    tok.set_ignore_merges(model.value("ignore_merges", false));
    read_pretokenizer(j.value("pre_tokenizer", json()), tok, c, "pre_tokenizer");
    for (const auto& a : j.value("added_tokens", json::array()))
        tok.add_special({a.at("content").get<std::string>(), a.at("id").get<int32_t>()});
    tok.set_kind("HF byte-level BPE");
    tok.finish();
    return tok;
}

}  // namespace hymoe::text
