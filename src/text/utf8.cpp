// UTF-8 validation, incomplete tails and U+FFFD substitution (text/utf8.h). Well-formed sequences
// are those of Unicode table 3-7: no overlongs, no surrogates, nothing above U+10FFFF.
#include "hymoe/text/utf8.h"

#include <cstdint>

namespace hymoe::text {

namespace {

// The allowed range of the second byte after lead byte b, and the sequence length (0: not a lead).
struct Lead {
    int len;
    uint8_t lo, hi;
};

Lead lead_of(uint8_t b) {
    if (b < 0x80)
        return {1, 0, 0};
    if (b >= 0xC2 && b <= 0xDF)
        return {2, 0x80, 0xBF};
    if (b == 0xE0)
        return {3, 0xA0, 0xBF};
    if (b == 0xED)
        return {3, 0x80, 0x9F};
    if (b >= 0xE1 && b <= 0xEF)
        return {3, 0x80, 0xBF};
    if (b == 0xF0)
        return {4, 0x90, 0xBF};
    if (b >= 0xF1 && b <= 0xF3)
        return {4, 0x80, 0xBF};
    if (b == 0xF4)
        return {4, 0x80, 0x8F};
    return {0, 0, 0};
}

// How many bytes from s[i] match a prefix of a well-formed sequence, and its full length.
size_t valid_prefix(std::string_view s, size_t i, int& len) {
    const Lead l = lead_of(static_cast<uint8_t>(s[i]));
    len = l.len;
    if (l.len <= 1)
        return static_cast<size_t>(l.len);
    size_t k = 1;
    for (; k < static_cast<size_t>(l.len) && i + k < s.size(); ++k) {
        const auto c = static_cast<uint8_t>(s[i + k]);
        const uint8_t lo = k == 1 ? l.lo : 0x80, hi = k == 1 ? l.hi : 0xBF;
        if (c < lo || c > hi)
            break;
    }
    return k;
}

}  // namespace

size_t utf8_char_len(std::string_view s, size_t i, size_t* bad_len) {
    int len = 0;
    const size_t k = valid_prefix(s, i, len);
    if (len > 0 && k == static_cast<size_t>(len))
        return k;
    if (bad_len)
        *bad_len = k == 0 ? 1 : k;
    return 0;
}

size_t utf8_first_invalid(std::string_view s) {
    for (size_t i = 0; i < s.size();) {
        if (static_cast<uint8_t>(s[i]) < 0x80) {
            ++i;
            continue;
        }
        const size_t n = utf8_char_len(s, i);
        if (n == 0)
            return i;
        i += n;
    }
    return std::string_view::npos;
}

size_t utf8_incomplete_tail(std::string_view s) {
    for (size_t back = 1; back <= 3 && back <= s.size(); ++back) {
        const size_t i = s.size() - back;
        const auto b = static_cast<uint8_t>(s[i]);
        if (b < 0x80)
            return 0;
        if (b >= 0xC0) {  // a lead byte: incomplete if everything after it fits its sequence
            int len = 0;
            const size_t k = valid_prefix(s, i, len);
            return len > 1 && k == back && back < static_cast<size_t>(len) ? back : 0;
        }
    }
    return 0;
}

std::string utf8_sanitize(std::string_view s) {
    std::string out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size();) {
        size_t bad = 0;
        const size_t n = utf8_char_len(s, i, &bad);
        if (n > 0) {
            out.append(s.substr(i, n));
            i += n;
        } else {
            out.append("\xEF\xBF\xBD");
            i += bad;
        }
    }
    return out;
}

}  // namespace hymoe::text
