// The Jinja subset's lexer (jinja_ast.h): the source cut into text, {{ }} and {% %} chunks, {# #}
// dropped, with HF's whitespace rules applied to the text between them:
//   - \r\n and \r become \n; one trailing newline of the source is dropped
//     (keep_trailing_newline off);
//   - {{- {%- {#- strip all whitespace before the tag, -}} -%} -#} all whitespace after it;
//   - trim_blocks: one newline right after %} or #} is dropped;
//   - lstrip_blocks: spaces and tabs between a line's start and {% or {# are dropped ({%+ keeps
//     them).
#include <cctype>

#include "hymoe/core/error.h"
#include "jinja_ast.h"

namespace hymoe::text::jinja {

void fail_at(const std::string& origin, int line, const std::string& what) {
    HYMOE_FAIL(Exit::invalid, origin, " line ", line, ": ", what);
}

namespace {

bool is_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

struct Lexer {
    const std::string& src;
    const std::string& origin;
    size_t pos = 0;
    int line = 1;

    void advance(size_t to) {
        for (; pos < to; ++pos)
            line += src[pos] == '\n';
    }
    bool at(const char* s) const {
        return src.compare(pos, std::char_traits<char>::length(s), s) == 0;
    }

    // One token at pos (whitespace skipped before it); false at the tag's end `close`.
    bool token(const std::string& close, std::vector<Token>& out) {
        while (pos < src.size() && is_space(src[pos]))
            advance(pos + 1);
        if (pos >= src.size())
            fail_at(origin, line, "the tag is not closed");
        if (at(("-" + close).c_str()) || at(close.c_str()))
            return false;
        Token t;
        t.line = line;
        const char c = src[pos];
        if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
            size_t e = pos;
            while (e < src.size() &&
                   (std::isalnum(static_cast<unsigned char>(src[e])) || src[e] == '_'))
                ++e;
            t.kind = Token::Kind::name, t.text = src.substr(pos, e - pos);
            advance(e);
        } else if (std::isdigit(static_cast<unsigned char>(c))) {
            size_t e = pos;
            while (e < src.size() && std::isdigit(static_cast<unsigned char>(src[e])))
                ++e;
            if (e + 1 < src.size() && src[e] == '.' &&
                std::isdigit(static_cast<unsigned char>(src[e + 1])))
                fail_at(origin, line, "a float literal is outside hymoe's Jinja subset");
            t.kind = Token::Kind::integer, t.text = src.substr(pos, e - pos);
            advance(e);
        } else if (c == '\'' || c == '"') {
            t.kind = Token::Kind::string;
            size_t e = pos + 1;
            for (; e < src.size() && src[e] != c; ++e) {
                if (src[e] != '\\' || e + 1 >= src.size()) {
                    t.text += src[e];
                    continue;
                }
                const char x = src[++e];
                if (std::string("ntr\\'\"").find(x) == std::string::npos)
                    fail_at(
                        origin, line, cat("the escape \\", x, " is outside hymoe's Jinja subset"));
                t.text += x == 'n' ? '\n' : x == 't' ? '\t' : x == 'r' ? '\r' : x;
            }
            if (e >= src.size())
                fail_at(origin, line, "the string is not closed");
            advance(e + 1);
        } else {
            static const char* kOps[] = {"==", "!=", "<=", ">=", "//", "**"};
            t.kind = Token::Kind::op;
            for (const char* op : kOps)
                if (at(op))
                    t.text = op;
            if (t.text.empty()) {
                if (std::string("+-*/%~<>()[]{}.,:|=").find(c) == std::string::npos)
                    fail_at(origin, line, cat("unexpected character '", c, "' in a tag"));
                t.text = std::string(1, c);
            }
            advance(pos + t.text.size());
        }
        out.push_back(std::move(t));
        return true;
    }
};

}  // namespace

std::vector<Chunk> lex(const std::string& source, const std::string& origin) {
    std::string src;
    for (size_t i = 0; i < source.size(); ++i)
        if (source[i] != '\r')
            src += source[i];
        else if (i + 1 >= source.size() || source[i + 1] != '\n')
            src += '\n';
    if (!src.empty() && src.back() == '\n')
        src.pop_back();
    Lexer lx{src, origin};
    std::vector<Chunk> out;
    while (lx.pos < src.size()) {
        const bool line_starting = lx.pos == 0 || src[lx.pos - 1] == '\n';
        size_t start = lx.pos;
        while ((start = src.find('{', start)) != std::string::npos &&
               !(start + 1 < src.size() &&
                 std::string("{%#").find(src[start + 1]) != std::string::npos))
            ++start;
        if (start == std::string::npos)
            start = src.size();
        Chunk text{Chunk::Kind::text, src.substr(lx.pos, start - lx.pos), {}, lx.line};
        lx.advance(start);
        if (start == src.size()) {
            out.push_back(std::move(text));
            break;
        }
        const char kind = src[start + 1];
        const char mark = start + 2 < src.size() ? src[start + 2] : '\0';
        if (mark == '-') {
            while (!text.text.empty() && is_space(text.text.back()))
                text.text.pop_back();
        } else if (kind != '{' && mark != '+') {         // lstrip_blocks
            const size_t l = text.text.rfind('\n') + 1;  // npos + 1 = 0
            if ((l > 0 || line_starting) && l < text.text.size() &&
                text.text.find_first_not_of(" \t", l) == std::string::npos)
                text.text.resize(l);
        }
        if (!text.text.empty())
            out.push_back(std::move(text));
        const int tag_line = lx.line;
        lx.advance(start + 2 + (mark == '-' || mark == '+'));
        bool strip_after = false;
        if (kind == '#') {
            const size_t end = src.find("#}", lx.pos);
            if (end == std::string::npos)
                fail_at(origin, tag_line, "the comment is not closed");
            strip_after = end > lx.pos && src[end - 1] == '-';
            lx.advance(end + 2);
        } else {
            const std::string close = kind == '{' ? "}}" : "%}";
            Chunk tag{kind == '{' ? Chunk::Kind::output : Chunk::Kind::statement, "", {}, tag_line};
            while (lx.token(close, tag.tokens)) {
            }
            strip_after = src[lx.pos] == '-';
            lx.advance(lx.pos + close.size() + strip_after);
            if (tag.tokens.empty())
                fail_at(origin, tag_line, "an empty tag");
            out.push_back(std::move(tag));
        }
        if (strip_after) {
            while (lx.pos < src.size() && is_space(src[lx.pos]))
                lx.advance(lx.pos + 1);
        } else if (kind != '{' && lx.pos < src.size() && src[lx.pos] == '\n') {  // trim_blocks
            lx.advance(lx.pos + 1);
        }
    }
    return out;
}

}  // namespace hymoe::text::jinja
