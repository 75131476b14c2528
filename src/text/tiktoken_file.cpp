// tiktoken rank files and the named encodings' patterns and special tokens (text/tokenizer.h).
// A rank file has one "<base64 bytes> <rank>" per line; ranks are the token ids. The patterns are
// the ones the encodings document: OpenAI's tiktoken for cl100k_base and o200k_base, Moonshot's
// tokenization_kimi.py for Kimi (with its 256 reserved special ids above the ranks).
#include <charconv>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "hymoe/core/error.h"
#include "hymoe/text/tokenizer.h"

namespace hymoe::text {

namespace fs = std::filesystem;

namespace {

constexpr const char* kCl100k =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

constexpr const char* kO200k =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

constexpr const char* kKimi =
    R"([\p{Han}]+)"
    R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

constexpr int kKimiReserved = 256;
constexpr int64_t kKimiMaxChars = 400'000, kKimiMaxRun = 25'000;  // tokenization_kimi.py

std::vector<SpecialToken> preset_specials(const std::string& name) {
    if (name == "cl100k_base")
        return {{"<|endoftext|>", 100257},
                {"<|fim_prefix|>", 100258},
                {"<|fim_middle|>", 100259},
                {"<|fim_suffix|>", 100260},
                {"<|endofprompt|>", 100276}};
    if (name == "o200k_base")
        return {{"<|endoftext|>", 199999}, {"<|endofprompt|>", 200018}};
    return {};
}

int decode_b64_char(char c) {
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    return c == '+' ? 62 : c == '/' ? 63 : -1;
}

// Standard base64 with '=' padding; false when s is not.
bool decode_base64(std::string_view s, std::string& out) {
    out.clear();
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 0; i < s.size(); ++i) {
        if (s[i] == '=')
            return s.size() % 4 == 0 && i + 2 >= s.size();
        const int v = decode_b64_char(s[i]);
        if (v < 0)
            return false;
        acc = acc << 6 | static_cast<uint32_t>(v), bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out += static_cast<char>((acc >> bits) & 0xFF);
        }
    }
    return s.size() % 4 == 0;
}

// added_tokens_decoder of tokenizer_config.json: {"163584": {"content": "[BOS]", ...}, ...}.
std::vector<SpecialToken> config_specials(const fs::path& file) {
    std::ifstream in(file);
    nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
    if (j.is_discarded() || !j.is_object())
        HYMOE_FAIL(Exit::invalid, file.string(), ": not a JSON object");
    std::vector<SpecialToken> out;
    if (!j.contains("added_tokens_decoder"))
        return out;
    for (const auto& [id, tok] : j["added_tokens_decoder"].items()) {
        if (!tok.is_object() || !tok.contains("content") || !tok["content"].is_string())
            HYMOE_FAIL(
                Exit::invalid, file.string(), ": added_tokens_decoder.", id, " has no content");
        out.push_back({tok["content"].get<std::string>(), std::stoi(id)});
    }
    return out;
}

}  // namespace

std::string tiktoken_preset_pattern(const std::string& name) {
    return name == "cl100k_base"  ? kCl100k
           : name == "o200k_base" ? kO200k
           : name == "kimi"       ? kKimi
                                  : "";
}

Tokenizer load_tiktoken(const std::string& path, const std::string& pattern) {
    std::ifstream in(path, std::ios::binary);
    if (!in)
        HYMOE_FAIL(Exit::invalid, path, ": cannot read the tiktoken rank file");
    const std::string stem = fs::path(path).filename().string();
    std::string preset = pattern;
    if (preset.empty())
        preset = stem.starts_with("cl100k_base")  ? "cl100k_base"
                 : stem.starts_with("o200k_base") ? "o200k_base"
                                                  : "kimi";
    const std::string regex = tiktoken_preset_pattern(preset);
    Tokenizer tok;
    int64_t line_no = 0, n_ranks = 0;
    std::string bytes;
    for (std::string line; std::getline(in, line);) {
        ++line_no;
        if (line.empty())
            continue;
        const size_t sp = line.find(' ');
        int64_t rank = -1;  // the whole rest of the line, digits only
        if (sp != std::string::npos) {
            const char* end = line.data() + line.size();
            if (auto [at, ec] = std::from_chars(line.data() + sp + 1, end, rank);
                ec != std::errc() || at != end)
                rank = -1;
        }
        if (rank < 0 || rank > kMaxTokenId ||
            !decode_base64(std::string_view(line).substr(0, sp), bytes))
            HYMOE_FAIL(Exit::invalid, path, ":", line_no, ": expected '<base64 token> <rank>'");
        tok.add_token(bytes, static_cast<int32_t>(rank));
        n_ranks = std::max(n_ranks, rank + 1);
    }
    if (n_ranks == 0)
        HYMOE_FAIL(Exit::invalid, path, ": holds no tokens");
    tok.add_pretokenizer(regex.empty() ? pattern : regex);
    for (const auto& s : preset_specials(preset))
        tok.add_special(s);
    const fs::path config = fs::path(path).parent_path() / "tokenizer_config.json";
    if (fs::exists(config))
        for (const auto& s : config_specials(config))
            tok.add_special(s);
    if (preset == "kimi")
        tok.set_chunking(kKimiMaxChars, kKimiMaxRun);
    if (preset == "kimi")
        for (int i = 0; i < kKimiReserved; ++i)
            if (tok.n_vocab() <= n_ranks + i ||
                tok.token_bytes(static_cast<int32_t>(n_ranks + i)).empty())
                tok.add_special({cat("<|reserved_token_", n_ranks + i, "|>"),
                                 static_cast<int32_t>(n_ranks + i)});
    tok.set_kind(cat("tiktoken BPE (", regex.empty() ? "custom" : preset, " pattern)"));
    tok.finish();
    return tok;
}

Tokenizer load_tokenizer(const std::string& path, const std::string& pattern) {
    std::error_code ec;
    fs::path file = path;
    if (fs::is_directory(file, ec)) {
        if (fs::exists(file / "tokenizer.json")) {
            file /= "tokenizer.json";
        } else if (fs::exists(file / "tiktoken.model")) {
            file /= "tiktoken.model";
        } else {
            fs::path found;
            for (const auto& e : fs::directory_iterator(file, ec))
                if (e.path().extension() == ".tiktoken")
                    found = e.path();
            if (found.empty())
                HYMOE_FAIL(Exit::invalid,
                           path,
                           ": holds no tokenizer.json, tiktoken.model or *.tiktoken file");
            file = found;
        }
    }
    if (file.extension() != ".json")
        return load_tiktoken(file.string(), pattern);
    std::ifstream in(file, std::ios::binary);
    if (!in)
        HYMOE_FAIL(Exit::invalid, file.string(), ": cannot read the tokenizer");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    return parse_hf_tokenizer(text, file.string());
}

}  // namespace hymoe::text
