// Unicode pre-tokenizer regexes through PCRE2 (UTF + UCP, JIT-compiled when the platform allows).
// Patterns are written as tiktoken and HF tokenizers write them (Rust regex / fancy_regex syntax)
// and translated to PCRE2 first (translate_pattern):
//   - \s and \S mean Unicode White_Space as in Rust (PCRE2's \s leaves out U+0085),
//   - a class intersection [X&&[^Y]] (Kimi's pattern) becomes (?:(?![Y])[X]).
// Matching expects valid UTF-8 (the caller checks once; PCRE2 does not check again).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace hymoe::text {

std::string translate_pattern(const std::string& pattern);

class Regex {
public:
    // Throws Exit::invalid naming the pattern and PCRE2's message when it does not compile.
    explicit Regex(const std::string& pattern, bool translate = true);
    ~Regex();
    Regex(const Regex&) = delete;
    Regex& operator=(const Regex&) = delete;

    // The first match at or after `from`: true with [begin, end); an empty match is skipped.
    bool find(std::string_view text, size_t from, size_t& begin, size_t& end) const;

    const std::string& pattern() const { return pattern_; }

private:
    std::string pattern_;
    void* code_ = nullptr;     // pcre2_code_8*
    void* match_ = nullptr;    // pcre2_match_data_8* (one thread per object)
    void* context_ = nullptr;  // pcre2_match_context_8*: heap limit, JIT stack
    void* stack_ = nullptr;    // pcre2_jit_stack_8*
    bool jit_ = false;
};

}  // namespace hymoe::text
