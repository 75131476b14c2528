// The Jinja subset's parser (jinja_ast.h): chunks -> statements, tokens -> expressions, by
// recursive descent with Jinja2's precedence (loosest first): a if c else b, or, and, not,
// comparisons and in, + -, ~, * / // %, unary -, then a primary with its postfixes
// (.attr, [i], [a:b:c], (args)), filters (| f(args)) and tests (is [not] t).
#include <charconv>
#include <set>

#include "hymoe/core/error.h"
#include "jinja_ast.h"

namespace hymoe::text::jinja {

namespace {

using TK = Token::Kind;

class ExprParser {
public:
    ExprParser(const std::vector<Token>& toks, size_t from, const std::string& origin, int line)
        : t_(toks), i_(from), origin_(origin), line_(line) {}

    ExprPtr expression() { return ternary(); }
    // Without a top-level `a if c else b`: a for loop's `if` is its filter, not a condition.
    ExprPtr loop_iterable() { return or_expr(); }
    bool done() const { return i_ >= t_.size(); }
    size_t pos() const { return i_; }
    bool accept(const std::string& text) {
        if (done() || t_[i_].text != text || t_[i_].kind == TK::string)
            return false;
        ++i_;
        return true;
    }
    void expect(const std::string& text) {
        if (!accept(text))
            fail(cat("expected '", text, "'"));
    }
    std::string name() {
        if (done() || t_[i_].kind != TK::name)
            fail("expected a name");
        return t_[i_++].text;
    }
    [[noreturn]] void fail(const std::string& what) const {
        fail_at(origin_,
                done() ? line_ : t_[i_].line,
                what + (done() ? " at the end of the tag" : " before '" + t_[i_].text + "'"));
    }

private:
    // Parentheses, lists, calls and unary operators nest at most kMaxDepth deep (the parser and
    // the evaluator recurse once per level).
    static constexpr int kMaxDepth = 100;
    struct Deeper {
        explicit Deeper(ExprParser& p) : p_(p) {
            if (++p_.depth_ > kMaxDepth)
                p_.fail(cat("an expression nested over ", kMaxDepth, " deep"));
        }
        ~Deeper() { --p_.depth_; }
        ExprParser& p_;
    };
    bool peek(const std::string& text, size_t ahead = 0) const {
        return i_ + ahead < t_.size() && t_[i_ + ahead].text == text &&
               t_[i_ + ahead].kind != TK::string;
    }
    ExprPtr node(Expr::Kind kind, std::string name, std::vector<ExprPtr> args) const {
        auto e = std::make_shared<Expr>();
        e->kind = kind, e->name = std::move(name), e->args = std::move(args);
        e->line = done() ? line_ : t_[i_ == 0 ? 0 : i_ - 1].line;
        return e;
    }
    ExprPtr ternary() {
        const Deeper d(*this);
        ExprPtr a = or_expr();
        if (!accept("if"))
            return a;
        ExprPtr cond = or_expr();
        ExprPtr b = accept("else") ? ternary() : nullptr;
        return node(Expr::Kind::ternary, "", {a, cond, b});
    }
    ExprPtr or_expr() {
        ExprPtr a = and_expr();
        while (accept("or"))
            a = node(Expr::Kind::binary, "or", {a, and_expr()});
        return a;
    }
    ExprPtr and_expr() {
        ExprPtr a = not_expr();
        while (accept("and"))
            a = node(Expr::Kind::binary, "and", {a, not_expr()});
        return a;
    }
    ExprPtr not_expr() {
        if (accept("not")) {
            const Deeper d(*this);
            return node(Expr::Kind::unary, "not", {not_expr()});
        }
        return compare();
    }
    ExprPtr compare() {
        ExprPtr a = math1(), chain_right;
        for (;;) {
            std::string op;
            for (const char* o : {"==", "!=", "<=", ">=", "<", ">", "in"})
                if (op.empty() && accept(o))
                    op = o;
            if (op.empty() && peek("not") && peek("in", 1))
                i_ += 2, op = "notin";
            if (op.empty())
                return a;
            // a < b < c is (a < b) and (b < c), as in Python
            ExprPtr b = math1();
            ExprPtr cmp = node(Expr::Kind::binary, op, {chain_right ? chain_right : a, b});
            a = chain_right ? node(Expr::Kind::binary, "and", {a, cmp}) : cmp;
            chain_right = b;
        }
    }
    ExprPtr math1() {
        ExprPtr a = concat();
        for (;;) {
            if (accept("+"))
                a = node(Expr::Kind::binary, "+", {a, concat()});
            else if (accept("-"))
                a = node(Expr::Kind::binary, "-", {a, concat()});
            else
                return a;
        }
    }
    ExprPtr concat() {
        ExprPtr a = math2();
        while (accept("~"))
            a = node(Expr::Kind::binary, "~", {a, math2()});
        return a;
    }
    ExprPtr math2() {
        ExprPtr a = unary();
        for (;;) {
            if (accept("*"))
                a = node(Expr::Kind::binary, "*", {a, unary()});
            else if (peek("/") || peek("//") || peek("%") || peek("**"))
                fail("the operator '" + t_[i_].text + "' is outside hymoe's Jinja subset");
            else
                return a;
        }
    }
    ExprPtr unary() {
        if (accept("-")) {
            const Deeper d(*this);
            return node(Expr::Kind::unary, "-", {unary()});
        }
        ExprPtr a = postfix(primary());
        for (;;) {
            if (accept("|")) {
                std::vector<ExprPtr> args = {a};
                const std::string f = name();
                if (accept("("))
                    call_args(args, nullptr);
                a = node(Expr::Kind::filter, f, args);
                a = postfix(a);
            } else if (accept("is")) {
                const bool negate = accept("not");
                const std::string test = name();
                auto e = std::const_pointer_cast<Expr>(node(Expr::Kind::test, test, {a}));
                e->negate = negate;
                if (peek("("))
                    fail("a test with arguments is outside hymoe's Jinja subset");
                a = e;
            } else {
                return a;
            }
        }
    }
    void call_args(std::vector<ExprPtr>& args,
                   std::vector<std::pair<std::string, ExprPtr>>* kwargs) {
        while (!accept(")")) {
            if (args.size() > 1 || (kwargs && !kwargs->empty()))
                expect(",");
            if (!done() && t_[i_].kind == TK::name && peek("=", 1)) {
                if (!kwargs)
                    fail("keyword arguments to a filter are outside hymoe's Jinja subset");
                std::string key = name();
                expect("=");
                kwargs->emplace_back(key, expression());
            } else {
                args.push_back(expression());
            }
        }
    }
    ExprPtr postfix(ExprPtr a) {
        for (;;) {
            if (accept(".")) {
                a = node(Expr::Kind::attr, name(), {a});
            } else if (accept("[")) {
                ExprPtr parts[3];
                int n = 0;
                for (;;) {
                    if (!peek(":") && !peek("]"))
                        parts[n] = expression();
                    if (accept("]"))
                        break;
                    expect(":");
                    if (++n > 2)
                        fail("a slice has at most three parts");
                }
                if (n == 0 && !parts[0])
                    fail("an empty subscript []");
                a = n == 0 ? node(Expr::Kind::index, "", {a, parts[0]})
                           : node(Expr::Kind::slice, "", {a, parts[0], parts[1], parts[2]});
            } else if (accept("(")) {
                auto e = std::const_pointer_cast<Expr>(node(Expr::Kind::call, "", {a}));
                call_args(e->args, &e->kwargs);
                a = e;
            } else {
                return a;
            }
        }
    }
    ExprPtr primary() {
        if (done())
            fail("expected an expression");
        const Token& t = t_[i_++];
        auto lit = [&](Value v) {
            auto e = std::const_pointer_cast<Expr>(node(Expr::Kind::literal, "", {}));
            e->value = std::move(v);
            return e;
        };
        if (t.kind == TK::string)
            return lit(Value::string(t.text));
        if (t.kind == TK::integer) {
            int64_t v = 0;
            const char* end = t.text.data() + t.text.size();
            const auto [ptr, ec] = std::from_chars(t.text.data(), end, v);
            if (ec != std::errc() || ptr != end)
                fail_at(origin_, t.line, "the integer " + t.text + " overflows 64 bits");
            return lit(Value::integer(v));
        }
        if (t.kind == TK::name) {
            if (t.text == "true" || t.text == "True")
                return lit(Value::boolean(true));
            if (t.text == "false" || t.text == "False")
                return lit(Value::boolean(false));
            if (t.text == "none" || t.text == "None")
                return lit(Value::none());
            return node(Expr::Kind::name, t.text, {});
        }
        if (t.text == "(") {
            ExprPtr e = expression();
            if (peek(","))
                fail("a tuple is outside hymoe's Jinja subset");
            expect(")");
            return e;
        }
        if (t.text == "[") {
            std::vector<ExprPtr> items;
            while (!accept("]")) {
                if (!items.empty())
                    expect(",");
                if (!accept("]"))
                    items.push_back(expression());
                else
                    break;
            }
            return node(Expr::Kind::list, "", items);
        }
        --i_;
        fail(t.text == "{" ? "a dict literal is outside hymoe's Jinja subset"
                           : "expected an expression");
    }

    const std::vector<Token>& t_;
    size_t i_;
    const std::string& origin_;
    int line_;
    int depth_ = 0;
};

class Parser {
public:
    Parser(const std::vector<Chunk>& chunks, const std::string& origin)
        : c_(chunks), origin_(origin) {}

    // Nodes up to a statement whose keyword is in `ends` (returned; "" at the end of the
    // template, which only the top level accepts).
    std::string body(std::vector<Node>& out, const std::set<std::string>& ends) {
        for (; i_ < c_.size(); ++i_) {
            const Chunk& c = c_[i_];
            Node n;
            n.line = c.line;
            if (c.kind == Chunk::Kind::text) {
                n.kind = Node::Kind::text, n.text = c.text;
            } else if (c.kind == Chunk::Kind::output) {
                ExprParser p(c.tokens, 0, origin_, c.line);
                n.kind = Node::Kind::output, n.expr = p.expression();
                if (!p.done())
                    p.fail("unexpected token");
            } else {
                const std::string& kw = c.tokens[0].text;
                if (ends.count(kw))
                    return kw;
                statement(c, n);
            }
            out.push_back(std::move(n));
        }
        if (!ends.empty())
            fail_at(
                origin_, open_line_, cat("the tag is never closed by {% ", *ends.rbegin(), " %}"));
        return "";
    }

private:
    void statement(const Chunk& c, Node& n) {
        const std::string kw = c.tokens[0].kind == TK::name ? c.tokens[0].text : "";
        ExprParser p(c.tokens, 1, origin_, c.line);
        const int outer = open_line_;
        const std::string outer_kw = outer_kw_;
        open_line_ = c.line, outer_kw_ = kw;
        if (++blocks_ > kMaxBlocks)
            fail_at(origin_, c.line, cat("blocks nested over ", kMaxBlocks, " deep"));
        if (kw == "if") {
            n.kind = Node::Kind::if_;
            ExprPtr cond = p.expression();
            end_of_tag(p);
            for (;;) {
                std::vector<Node> b;
                ++i_;
                const std::string end = body(b, {"elif", "else", "endif"});
                n.branches.emplace_back(cond, std::move(b));
                const Chunk& e = c_[i_];
                ExprParser q(e.tokens, 1, origin_, e.line);
                if (end == "elif") {
                    cond = q.expression();
                    end_of_tag(q);
                    continue;
                }
                end_of_tag(q);
                if (end == "else") {
                    ++i_;
                    body(n.body, {"endif"});
                    end_of_tag(ExprParser(c_[i_].tokens, 1, origin_, c_[i_].line));
                }
                break;
            }
        } else if (kw == "for") {
            n.kind = Node::Kind::for_;
            n.var = p.name();
            if (p.accept(","))
                p.fail("unpacking in a for loop is outside hymoe's Jinja subset");
            p.expect("in");
            n.expr = p.loop_iterable();
            if (!p.done())
                p.fail("a for loop's filter or recursive is outside hymoe's Jinja subset");
            ++i_;
            if (body(n.body, {"endfor", "else"}) == "else")
                fail_at(origin_, c_[i_].line, "for ... else is outside hymoe's Jinja subset");
            end_of_tag(ExprParser(c_[i_].tokens, 1, origin_, c_[i_].line));
        } else if (kw == "set") {
            n.kind = Node::Kind::set;
            n.var = p.name();
            if (p.accept("."))
                n.attr = p.name();
            if (p.done())
                p.fail("a block set ({% set x %}...{% endset %}) is outside hymoe's Jinja subset");
            if (p.accept(","))
                p.fail("unpacking in set is outside hymoe's Jinja subset");
            p.expect("=");
            n.expr = p.expression();
            end_of_tag(p);
        } else if (kw == "elif" || kw == "else" || kw == "endif" || kw == "endfor") {
            fail_at(origin_,
                    c.line,
                    outer_kw.empty() ? cat("{% ", kw, " %} without its opening tag")
                                     : cat("{% ",
                                           kw,
                                           " %} inside the {% ",
                                           outer_kw,
                                           " %} of line ",
                                           outer,
                                           ", which is not closed"));
        } else {
            fail_at(origin_,
                    c.line,
                    cat("the tag {% ",
                        c.tokens[0].text,
                        " %} is outside hymoe's Jinja subset (if, elif, else, for, set)"));
        }
        open_line_ = outer, outer_kw_ = outer_kw;
        --blocks_;
    }
    void end_of_tag(const ExprParser& p) {
        if (!p.done())
            p.fail("unexpected token");
    }

    const std::vector<Chunk>& c_;
    const std::string& origin_;
    size_t i_ = 0;
    int open_line_ = 0;
    std::string outer_kw_;                  // the block being parsed ("" at the top)
    static constexpr int kMaxBlocks = 100;  // if/for nest at most this deep (both passes recurse)
    int blocks_ = 0;
};

}  // namespace

std::shared_ptr<const Template> parse(const std::string& source, const std::string& origin) {
    auto t = std::make_shared<Template>();
    t->origin = origin;
    const std::vector<Chunk> chunks = lex(source, origin);
    Parser(chunks, origin).body(t->body, {});
    return t;
}

}  // namespace hymoe::text::jinja
