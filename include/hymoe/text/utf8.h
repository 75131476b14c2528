// UTF-8 checks for text in and text out. Invalid input is reported by byte offset; generated
// bytes that are not valid UTF-8 become U+FFFD, one per maximal ill-formed subpart (the Unicode
// "substitution of maximal subparts" practice), so a stream cut anywhere and sanitised piece by
// piece (text/tokenizer.h Detokenizer) gives the same text as the whole sanitised at once.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace hymoe::text {

// Length of the valid UTF-8 sequence that starts at s[i] (1..4), or 0 if none does; *bad_len gets
// the length of the maximal ill-formed subpart (≥ 1) when it returns 0.
size_t utf8_char_len(std::string_view s, size_t i, size_t* bad_len = nullptr);

// Offset of the first byte that is not part of valid UTF-8, or npos when all of s is valid.
size_t utf8_first_invalid(std::string_view s);

// How many bytes at the end of s begin a valid character that is not complete yet (0..3).
size_t utf8_incomplete_tail(std::string_view s);

// s with every ill-formed subpart replaced by U+FFFD.
std::string utf8_sanitize(std::string_view s);

}  // namespace hymoe::text
