// PCRE2 regexes for pre-tokenization and the translation of Rust-regex patterns (text/regex.h).
#include "hymoe/text/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "hymoe/core/error.h"

namespace hymoe::text {

namespace {

constexpr size_t kJitStackBytes = size_t{256} << 20;  // reserved, committed as used
constexpr uint32_t kHeapLimitKiB = 4u << 20;          // 4 GiB

// Unicode White_Space (what \s means in Rust's regex), as the inside of a character class.
constexpr const char* kSpace =
    "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
    "\\x{202F}\\x{205F}\\x{3000}";

// The end of the class that opens at p[i] == '[' (the index of its closing ']').
size_t class_end(const std::string& p, size_t i) {
    size_t j = i + 1;
    if (j < p.size() && p[j] == '^')
        ++j;
    if (j < p.size() && p[j] == ']')
        ++j;  // a leading ']' is literal
    for (; j < p.size(); ++j) {
        if (p[j] == '\\')
            ++j;
        else if (p[j] == '[')
            j = class_end(p, j);
        else if (p[j] == ']')
            return j;
    }
    HYMOE_FAIL(Exit::invalid, "pattern '", p, "': unclosed character class");
}

// The inside of a class with \s expanded; \S inside a class has no PCRE2 equivalent here.
std::string class_body(const std::string& p, const std::string& body) {
    std::string out;
    for (size_t j = 0; j < body.size(); ++j) {
        if (body[j] == '\\' && j + 1 < body.size()) {
            if (body[j + 1] == 's') {
                out += kSpace;
            } else if (body[j + 1] == 'S') {
                HYMOE_FAIL(Exit::invalid, "pattern '", p, "': \\S inside a class is not supported");
            } else {
                out += body.substr(j, 2);
            }
            ++j;
        } else if (body[j] == '[') {
            const size_t e = class_end(body, j);
            out += "[" + class_body(p, body.substr(j + 1, e - j - 1)) + "]";
            j = e;
        } else {
            out += body[j];
        }
    }
    return out;
}

}  // namespace

std::string translate_pattern(const std::string& p) {
    std::string out;
    for (size_t i = 0; i < p.size(); ++i) {
        if (p[i] == '\\' && i + 1 < p.size()) {
            if (p[i + 1] == 's')
                out += std::string("[") + kSpace + "]";
            else if (p[i + 1] == 'S')
                out += std::string("[^") + kSpace + "]";
            else
                out += p.substr(i, 2);
            ++i;
        } else if (p[i] == '[') {
            const size_t e = class_end(p, i);
            std::string body = p.substr(i + 1, e - i - 1);
            const size_t amp = body.find("&&[^");
            if (amp != std::string::npos && body.back() == ']' &&
                class_end(body, amp + 2) == body.size() - 1) {  // [X&&[^Y]] -> (?:(?![Y])[X])
                const std::string x = body.substr(0, amp);
                const std::string y = body.substr(amp + 4, body.size() - amp - 5);
                out += "(?:(?![" + class_body(p, y) + "])[" + class_body(p, x) + "])";
            } else {
                if (body.find("&&") != std::string::npos)
                    HYMOE_FAIL(Exit::invalid,
                               "pattern '",
                               p,
                               "': only the intersection [X&&[^Y]] is supported");
                out += "[" + class_body(p, body) + "]";
            }
            i = e;
        } else {
            out += p[i];
        }
    }
    return out;
}

Regex::Regex(const std::string& pattern, bool translate)
    : pattern_(translate ? translate_pattern(pattern) : pattern) {
    int err = 0;
    PCRE2_SIZE at = 0;
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern_.data()),
                                     pattern_.size(),
                                     PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK,
                                     &err,
                                     &at,
                                     nullptr);
    if (!code) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        HYMOE_FAIL(Exit::invalid,
                   "tokenizer pattern '",
                   pattern,
                   "' does not compile (",
                   reinterpret_cast<const char*>(msg),
                   " at offset ",
                   at,
                   ")");
    }
    jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
    code_ = code;
    match_ = pcre2_match_data_create_from_pattern(code, nullptr);
    // Long runs under a repeated group with a lookahead (Kimi's letter classes) need more than
    // PCRE2's default 32 KiB JIT stack and 20 MB interpreter heap; both grow on demand.
    auto* context = pcre2_match_context_create(nullptr);
    pcre2_set_heap_limit(context, kHeapLimitKiB);
    if (jit_) {
        auto* stack = pcre2_jit_stack_create(32 * 1024, kJitStackBytes, nullptr);
        pcre2_jit_stack_assign(context, nullptr, stack);
        stack_ = stack;
    }
    context_ = context;
}

Regex::~Regex() {
    pcre2_match_context_free(static_cast<pcre2_match_context*>(context_));
    pcre2_jit_stack_free(static_cast<pcre2_jit_stack*>(stack_));
    pcre2_match_data_free(static_cast<pcre2_match_data*>(match_));
    pcre2_code_free(static_cast<pcre2_code*>(code_));
}

bool Regex::find(std::string_view text, size_t from, size_t& begin, size_t& end) const {
    auto* code = static_cast<pcre2_code*>(code_);
    auto* md = static_cast<pcre2_match_data*>(match_);
    auto* context = static_cast<pcre2_match_context*>(context_);
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    while (from < text.size()) {
        int rc = jit_ ? pcre2_jit_match(code, subject, text.size(), from, 0, md, context)
                      : PCRE2_ERROR_JIT_STACKLIMIT;
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT)  // no JIT, or its stack is full: the interpreter
            rc = pcre2_match(
                code, subject, text.size(), from, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, context);
        if (rc == PCRE2_ERROR_NOMATCH)
            return false;
        HYMOE_CHECK(rc > 0, "pcre2 match error ", rc, " for pattern ", pattern_);
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
        begin = ov[0], end = ov[1];
        if (end > begin)
            return true;
        from = begin + 1;  // an empty match: move on by one character
        while (from < text.size() && (static_cast<unsigned char>(text[from]) & 0xC0) == 0x80)
            ++from;
    }
    return false;
}

}  // namespace hymoe::text
