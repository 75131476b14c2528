// Byte-level BPE tokenizers: tiktoken rank files (Kimi, cl100k_base, o200k_base) and HF
// tokenizer.json (DeepSeek). Encoding: special (added) tokens are cut out of the text first, each
// remaining span is cut into pieces by the pre-tokenizer regexes (text/regex.h; the text between
// matches is a piece too), and each piece's bytes are merged:
//   - tiktoken (no merge list): repeatedly merge the adjacent pair whose joined bytes have the
//     lowest rank, a piece that is one token as a whole being that token;
//   - HF merges: repeatedly merge the adjacent pair of tokens that comes first in the merge list
//     (leftmost on ties), starting from one token per byte.
// Token ids are int32; a token's bytes may end inside a UTF-8 character, so decode() returns raw
// bytes and Detokenizer releases text a whole character at a time.
// Loading: load_tokenizer() takes a file or a model folder (tokenizer.json, else tiktoken.model or
// *.tiktoken, with tokenizer_config.json's added_tokens_decoder for the special tokens).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "hymoe/text/regex.h"

namespace hymoe::text {

// Token ids a tokenizer file may give: 0 .. 2^24 − 1 (the largest real vocabularies are ~200k;
// an id is a slot of the id table, so a file's id of 2^31 would be a 64 GB table).
inline constexpr int64_t kMaxTokenId = (int64_t{1} << 24) - 1;

struct SpecialToken {
    std::string text;
    int32_t id = 0;
};

struct Utf8Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const;
};

class Tokenizer {
public:
    // Encode valid UTF-8 text. allow_special: special tokens written in the text become their
    // ids, and a marker that looks like one (<|name|> or <｜name｜>) but is unknown is an error.
    // Exit::bad_input errors: "invalid UTF-8 at byte N", "unknown special token '<|x|>'".
    std::vector<int32_t> encode(std::string_view text, bool allow_special = true) const;
    // Plain text only (special tokens are ordinary text), appended to out; valid UTF-8 expected.
    void encode_ordinary(std::string_view text, std::vector<int32_t>& out) const;
    // The bytes of the tokens (not necessarily valid UTF-8); Exit::bad_input for an unknown id.
    std::string decode(const int32_t* ids, size_t n) const;
    std::string decode(const std::vector<int32_t>& ids) const {
        return decode(ids.data(), ids.size());
    }
    const std::string& token_bytes(int32_t id) const;

    int32_t n_vocab() const { return static_cast<int32_t>(bytes_.size()); }
    int32_t special_id(std::string_view text) const;  // −1 when text is no special token
    const std::vector<SpecialToken>& specials() const { return specials_; }
    std::string describe() const;  // "tiktoken BPE, 100277 tokens, 5 special, 1 regex"

    // Building (tiktoken_file.cpp, hf_json.cpp): tokens, then merges, regexes and specials.
    void add_token(std::string bytes, int32_t id);
    void add_merge(int32_t left, int32_t right, int32_t rank);  // none: tiktoken ranks
    void add_pretokenizer(const std::string& pattern);
    void add_special(const SpecialToken& t);
    void set_kind(std::string kind) { kind_ = std::move(kind); }
    void set_ignore_merges(bool on) { ignore_merges_ = on; }  // HF: a whole-piece token wins
    // Kimi: encode windows of max_chars code points, cut where a run of space or non-space
    // characters exceeds max_run (for_each_chunk); 0 = the text whole.
    void set_chunking(int64_t max_chars, int64_t max_run) {
        max_chunk_chars_ = max_chars, max_run_chars_ = max_run;
    }
    void finish();  // checks every byte has a token; compiles the special-token regex

private:
    void for_each_chunk(std::string_view text,
                        const std::function<void(std::string_view)>& f) const;
    void encode_span(std::string_view text, bool allow_special, std::vector<int32_t>& out) const;
    void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;
    void merge_ranks(std::string_view piece, std::vector<int32_t>& out) const;
    void merge_pairs(std::string_view piece, std::vector<int32_t>& out) const;
    void split(size_t stage, std::string_view text, std::vector<int32_t>& out) const;
    int32_t rank_of(std::string_view bytes) const;  // −1 when not a token
    void index_token(int32_t id);                   // into slots_, growing it at half full

    std::string kind_ = "tiktoken BPE";
    std::vector<std::string> bytes_;  // [n_vocab] id -> bytes
    // bytes -> id of the mergeable tokens, open addressing (linear probing, power-of-two size):
    // a slot holds hash >> 32 << 32 | (id + 1), 0 = empty
    std::vector<uint64_t> slots_;
    int64_t n_tokens_ = 0;
    std::unordered_map<uint64_t, uint64_t> merges_;  // left << 32 | right -> rank << 32 | id
    bool ignore_merges_ = false;
    int64_t max_chunk_chars_ = 0, max_run_chars_ = 0;
    int32_t byte_id_[256];
    std::vector<std::unique_ptr<Regex>> stages_;
    std::vector<SpecialToken> specials_;
    std::unordered_map<std::string, int32_t, Utf8Hash, std::equal_to<>> special_ids_;
    std::unique_ptr<Regex> special_re_, marker_re_;
};

// Streaming detokenisation: push() returns the text that is complete so far and holds back the
// bytes of a character not finished yet; ill-formed bytes become U+FFFD (text/utf8.h), so the
// pieces joined equal utf8_sanitize(decode(all ids)).
class Detokenizer {
public:
    explicit Detokenizer(const Tokenizer& tok) : tok_(tok) {}
    std::string push(int32_t id);
    std::string finish();  // the held-back bytes (an unfinished character becomes U+FFFD)

private:
    const Tokenizer& tok_;
    std::string pending_;
};

// The pre-tokenizer pattern and special tokens of a named tiktoken encoding: "cl100k_base",
// "o200k_base" or "kimi" (Kimi K2 / Kimi-Linear); "" when the name is none of them.
std::string tiktoken_preset_pattern(const std::string& name);

// A tiktoken rank file ("<base64 token> <rank>" per line). pattern: a preset name or a regex;
// "" = the preset named by the file (cl100k_base*, o200k_base*) or else "kimi". Special tokens:
// the preset's, then those of tokenizer_config.json beside the file (added_tokens_decoder), and
// for kimi the 256 reserved ids above the ranks as <|reserved_token_N|>; kimi also cuts long
// texts as tokenization_kimi.py does (set_chunking(400000, 25000)).
Tokenizer load_tiktoken(const std::string& path, const std::string& pattern = "");
// An HF tokenizer.json of a byte-level BPE model (text in `json`, `path` for messages).
Tokenizer parse_hf_tokenizer(const std::string& json, const std::string& path);
// A file (.json: HF; otherwise tiktoken) or a folder holding tokenizer.json, tiktoken.model or one
// *.tiktoken file. Exit::invalid errors name the file.
Tokenizer load_tokenizer(const std::string& path, const std::string& pattern = "");

}  // namespace hymoe::text
