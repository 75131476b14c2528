// Encoding and decoding of the byte-level BPE tokenizer (text/tokenizer.h) and its building steps.
#include "hymoe/text/tokenizer.h"

#include <algorithm>
#include <climits>

#include "hymoe/core/error.h"
#include "hymoe/text/utf8.h"

namespace hymoe::text {

size_t Utf8Hash::operator()(std::string_view s) const {
    uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a, 8 bytes at a time then the tail
    size_t i = 0;
    for (; i + 8 <= s.size(); i += 8) {
        uint64_t w;
        __builtin_memcpy(&w, s.data() + i, 8);
        h = (h ^ w) * 0x100000001b3ull;
        h ^= h >> 29;
    }
    for (; i < s.size(); ++i)
        h = (h ^ static_cast<uint8_t>(s[i])) * 0x100000001b3ull;
    return h ^ (h >> 32);
}

void Tokenizer::add_token(std::string bytes, int32_t id) {
    HYMOE_CHECK(id >= 0, "token id ", id);
    if (static_cast<size_t>(id) >= bytes_.size())
        bytes_.resize(static_cast<size_t>(id) + 1);
    if (rank_of(bytes) >= 0)
        return;  // the first id of the same bytes wins
    bytes_[static_cast<size_t>(id)] = std::move(bytes);
    index_token(id);
}

void Tokenizer::index_token(int32_t id) {
    if (2 * (n_tokens_ + 1) > static_cast<int64_t>(slots_.size())) {
        std::vector<uint64_t> old(std::max<size_t>(1024, 2 * slots_.size()), 0);
        old.swap(slots_);
        n_tokens_ = 0;
        for (uint64_t s : old)
            if (s != 0)
                index_token(static_cast<int32_t>((s & 0xffffffffu) - 1));
    }
    const uint64_t h = Utf8Hash{}(bytes_[static_cast<size_t>(id)]);
    const size_t mask = slots_.size() - 1;
    size_t i = h & mask;
    while (slots_[i] != 0)
        i = (i + 1) & mask;
    slots_[i] = (h >> 32 << 32) | static_cast<uint32_t>(id + 1);
    ++n_tokens_;
}

void Tokenizer::add_merge(int32_t left, int32_t right, int32_t rank) {
    const auto key = static_cast<uint64_t>(left) << 32 | static_cast<uint32_t>(right);
    const std::string joined =
        bytes_.at(static_cast<size_t>(left)) + bytes_.at(static_cast<size_t>(right));
    const int32_t id = rank_of(joined);
    if (id < 0)
        HYMOE_FAIL(Exit::invalid, "merge ", rank, " makes a token that is not in the vocabulary");
    merges_.emplace(key, static_cast<uint64_t>(rank) << 32 | static_cast<uint32_t>(id));
}

void Tokenizer::add_pretokenizer(const std::string& pattern) {
    stages_.push_back(std::make_unique<Regex>(pattern));
}

void Tokenizer::add_special(const SpecialToken& t) {
    if (special_ids_.contains(t.text))
        return;
    if (static_cast<size_t>(t.id) >= bytes_.size())
        bytes_.resize(static_cast<size_t>(t.id) + 1);
    bytes_[static_cast<size_t>(t.id)] = t.text;
    specials_.push_back(t);
    special_ids_.emplace(t.text, t.id);
}

void Tokenizer::finish() {
    for (int b = 0; b < 256; ++b) {
        byte_id_[b] = rank_of(std::string(1, static_cast<char>(b)));
        if (byte_id_[b] < 0)
            HYMOE_FAIL(
                Exit::invalid, "the vocabulary has no token for byte ", b, " (not byte-level BPE)");
    }
    marker_re_ = std::make_unique<Regex>("<\\|[^|\\s<>]{1,64}\\|>|<｜[^｜\\s]{1,64}｜>");
    if (specials_.empty())
        return;
    std::vector<std::string> texts;
    for (const auto& s : specials_)
        texts.push_back(s.text);
    std::sort(texts.begin(), texts.end(), [](const auto& a, const auto& b) {
        return a.size() > b.size();  // longest first: a special inside a longer one loses
    });
    std::string alt;
    for (const auto& t : texts) {
        alt += alt.empty() ? "" : "|";
        for (char c : t) {
            if (static_cast<unsigned char>(c) < 0x80 &&
                !std::isalnum(static_cast<unsigned char>(c)))
                alt += '\\';
            alt += c;
        }
    }
    special_re_ = std::make_unique<Regex>(alt, false);
}

int32_t Tokenizer::rank_of(std::string_view bytes) const {
    if (slots_.empty())
        return -1;
    const uint64_t h = Utf8Hash{}(bytes);
    const size_t mask = slots_.size() - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
        const uint64_t s = slots_[i];
        if (s == 0)
            return -1;
        if (s >> 32 == h >> 32) {
            const auto id = static_cast<int32_t>((s & 0xffffffffu) - 1);
            if (bytes_[static_cast<size_t>(id)] == bytes)
                return id;
        }
    }
}

int32_t Tokenizer::special_id(std::string_view text) const {
    auto it = special_ids_.find(text);
    return it == special_ids_.end() ? -1 : it->second;
}

const std::string& Tokenizer::token_bytes(int32_t id) const {
    if (id < 0 || id >= n_vocab())
        HYMOE_FAIL(
            Exit::bad_input, "token id ", id, " is outside the vocabulary [0, ", n_vocab(), ")");
    return bytes_[static_cast<size_t>(id)];
}

std::string Tokenizer::describe() const {
    return cat(kind_,
               ", ",
               n_tokens_,
               " tokens, ",
               specials_.size(),
               " special, ",
               stages_.size(),
               stages_.size() == 1 ? " regex" : " regexes");
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool allow_special) const {
    const size_t bad = utf8_first_invalid(text);
    if (bad != std::string_view::npos)
        HYMOE_FAIL(Exit::bad_input, "invalid UTF-8 at byte ", bad);
    std::vector<int32_t> out;
    out.reserve(text.size() / 3 + 1);
    if (max_chunk_chars_ == 0)
        encode_span(text, allow_special, out);
    else
        for_each_chunk(text, [&](std::string_view s) { encode_span(s, allow_special, out); });
    return out;
}

namespace {

// The code point at s[i] (valid UTF-8) and its length.
uint32_t code_point(std::string_view s, size_t i, size_t& len) {
    const auto b = static_cast<uint8_t>(s[i]);
    len = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
    uint32_t cp = len == 1 ? b : b & (0x7F >> len);
    for (size_t k = 1; k < len; ++k)
        cp = cp << 6 | (static_cast<uint8_t>(s[i + k]) & 0x3Fu);
    return cp;
}

// Python's str.isspace: Unicode White_Space and the separators U+001C..U+001F.
bool python_space(uint32_t c) {
    return (c >= 9 && c <= 13) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
           c == 0x202F || c == 0x205F || c == 0x3000;
}

}  // namespace

// Kimi's cut of long texts (tokenization_kimi.py, as Llama 3's): windows of max_chunk_chars_ code
// points, each cut again where a run of space or non-space code points grows past max_run_chars_.
void Tokenizer::for_each_chunk(std::string_view text,
                               const std::function<void(std::string_view)>& f) const {
    auto runs = [&](std::string_view w) {
        size_t start = 0, len = 0, n = 0;
        bool space = !w.empty() && python_space(code_point(w, 0, n));
        int64_t run = 0;
        for (size_t i = 0; i < w.size(); i += len) {
            const bool now = python_space(code_point(w, i, len));
            if (now != space) {
                run = 1, space = now;
            } else if (++run > max_run_chars_) {
                f(w.substr(start, i - start));
                start = i, run = 1;
            }
        }
        f(w.substr(start));
    };
    size_t window = 0, len = 0;
    int64_t count = 0;
    for (size_t i = 0; i < text.size(); i += len) {
        code_point(text, i, len);
        if (count++ == max_chunk_chars_) {
            runs(text.substr(window, i - window));
            window = i, count = 1;
        }
    }
    runs(text.substr(window));
}

void Tokenizer::encode_span(std::string_view text,
                            bool allow_special,
                            std::vector<int32_t>& out) const {
    if (!allow_special) {
        encode_ordinary(text, out);
        return;
    }
    auto plain = [&](std::string_view s) {
        size_t b = 0, e = 0;
        if (marker_re_->find(s, 0, b, e))
            HYMOE_FAIL(Exit::bad_input, "unknown special token '", s.substr(b, e - b), "'");
        encode_ordinary(s, out);
    };
    size_t at = 0, b = 0, e = 0;
    while (special_re_ && special_re_->find(text, at, b, e)) {
        plain(text.substr(at, b - at));
        out.push_back(special_id(text.substr(b, e - b)));
        at = e;
    }
    plain(text.substr(at));
}

void Tokenizer::encode_ordinary(std::string_view text, std::vector<int32_t>& out) const {
    if (!text.empty())
        split(0, text, out);
}

// Pieces of `text` by stage `stage` (matches and the gaps between them), each cut again by the
// next stage, the last stage's pieces merged.
void Tokenizer::split(size_t stage, std::string_view text, std::vector<int32_t>& out) const {
    if (stage == stages_.size()) {
        encode_piece(text, out);
        return;
    }
    size_t at = 0, b = 0, e = 0;
    while (at < text.size() && stages_[stage]->find(text, at, b, e)) {
        if (b > at)
            split(stage + 1, text.substr(at, b - at), out);
        split(stage + 1, text.substr(b, e - b), out);
        at = e;
    }
    if (at < text.size())
        split(stage + 1, text.substr(at), out);
}

void Tokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
    if (piece.size() == 1) {
        out.push_back(byte_id_[static_cast<uint8_t>(piece[0])]);
    } else if (merges_.empty()) {
        merge_ranks(piece, out);
    } else if (const int32_t whole = ignore_merges_ ? rank_of(piece) : -1; whole >= 0) {
        out.push_back(whole);
    } else {
        merge_pairs(piece, out);
    }
}

// tiktoken's byte-pair merge: parts[i] = (start of part i, rank of part i joined with part i+1).
void Tokenizer::merge_ranks(std::string_view piece, std::vector<int32_t>& out) const {
    if (const int32_t whole = rank_of(piece); whole >= 0) {
        out.push_back(whole);
        return;
    }
    constexpr int32_t kNone = INT32_MAX;
    struct Part {
        size_t start;
        int32_t rank;  // of this part joined with the next
        int32_t id;    // this part's token
    };
    std::vector<Part> parts(piece.size() + 1);
    auto joined_rank = [&](size_t i, size_t skip) {  // rank of parts i..i+skip joined
        if (i + skip + 1 >= parts.size())
            return kNone;
        const int32_t r =
            rank_of(piece.substr(parts[i].start, parts[i + skip + 1].start - parts[i].start));
        return r < 0 ? kNone : r;
    };
    for (size_t i = 0; i < parts.size(); ++i)
        parts[i] = {i, kNone, i < piece.size() ? byte_id_[static_cast<uint8_t>(piece[i])] : -1};
    for (size_t i = 0; i + 2 < parts.size(); ++i)
        parts[i].rank = joined_rank(i, 1);
    while (parts.size() > 2) {
        size_t best = 0;
        for (size_t i = 1; i + 2 < parts.size(); ++i)
            if (parts[i].rank < parts[best].rank)
                best = i;
        if (parts[best].rank == kNone)
            break;
        parts[best].id = parts[best].rank;
        parts[best].rank = joined_rank(best, 2);
        if (best > 0)
            parts[best - 1].rank = joined_rank(best - 1, 2);
        parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(best) + 1);
    }
    for (size_t i = 0; i + 1 < parts.size(); ++i)
        out.push_back(parts[i].id);
}

// HF BPE: merge the adjacent pair with the lowest merge rank (leftmost on ties) until none is left.
void Tokenizer::merge_pairs(std::string_view piece, std::vector<int32_t>& out) const {
    std::vector<int32_t> sym(piece.size());
    for (size_t i = 0; i < piece.size(); ++i)
        sym[i] = byte_id_[static_cast<uint8_t>(piece[i])];
    while (sym.size() > 1) {
        uint64_t best = UINT64_MAX;
        size_t at = 0;
        for (size_t i = 0; i + 1 < sym.size(); ++i) {
            auto it = merges_.find(static_cast<uint64_t>(sym[i]) << 32 |
                                   static_cast<uint32_t>(sym[i + 1]));
            if (it != merges_.end() && it->second < best)
                best = it->second, at = i;
        }
        if (best == UINT64_MAX)
            break;
        sym[at] = static_cast<int32_t>(best & 0xffffffffu);
        sym.erase(sym.begin() + static_cast<std::ptrdiff_t>(at) + 1);
    }
    out.insert(out.end(), sym.begin(), sym.end());
}

std::string Tokenizer::decode(const int32_t* ids, size_t n) const {
    std::string s;
    for (size_t i = 0; i < n; ++i)
        s += token_bytes(ids[i]);
    return s;
}

std::string Detokenizer::push(int32_t id) {
    pending_ += tok_.token_bytes(id);
    const size_t keep = utf8_incomplete_tail(pending_);
    std::string ready = utf8_sanitize(std::string_view(pending_).substr(0, pending_.size() - keep));
    pending_.erase(0, pending_.size() - keep);
    return ready;
}

std::string Detokenizer::finish() {
    std::string rest = utf8_sanitize(pending_);
    pending_.clear();
    return rest;
}

}  // namespace hymoe::text
