// The Jinja subset's tokens and syntax tree (text/jinja.h), shared by the lexer, the parser and
// the evaluator. Lines are 1-based lines of the template source.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "hymoe/text/jinja.h"

namespace hymoe::text::jinja {

// A token inside {{ }} or {% %}.
struct Token {
    enum class Kind { name, string, integer, op };
    Kind kind = Kind::op;
    std::string text;  // the name, the string's value, the digits or the operator
    int line = 0;
};

// The template cut into text and tags, whitespace control already applied to the text.
struct Chunk {
    enum class Kind { text, output, statement };
    Kind kind = Kind::text;
    std::string text;
    std::vector<Token> tokens;
    int line = 0;
};

// The chunks of a template (comments dropped); Exit::invalid for an unclosed tag or string.
std::vector<Chunk> lex(const std::string& source, const std::string& origin);

struct Expr;
using ExprPtr = std::shared_ptr<const Expr>;

struct Expr {
    enum class Kind {
        literal,  // value
        name,     // name
        list,     // args: the items
        attr,     // args[0].name
        index,    // args[0][args[1]]
        slice,    // args[0][args[1]:args[2]:args[3]] (null = absent)
        call,     // args[0](args[1..], kwargs)
        filter,   // args[0] | name(args[1..])
        test,     // args[0] is [not] name
        unary,    // name (not, -) args[0]
        binary,   // args[0] name args[1]: or and == != < > <= >= in notin + - * ~
        ternary,  // args[0] if args[1] else args[2] (null: undefined)
    };
    Kind kind = Kind::literal;
    int line = 0;
    Value value;
    std::string name;
    bool negate = false;  // test: is not
    std::vector<ExprPtr> args;
    std::vector<std::pair<std::string, ExprPtr>> kwargs;
};

struct Node {
    enum class Kind { text, output, if_, for_, set };
    Kind kind = Kind::text;
    int line = 0;
    std::string text;  // text
    ExprPtr expr;      // output, for (the list), set (the value)
    std::string var;   // for: the loop variable; set: the target
    std::string attr;  // set ns.attr: the attribute ("" for a plain set)
    std::vector<std::pair<ExprPtr, std::vector<Node>>> branches;  // if/elif (cond, body)
    std::vector<Node> body;                                       // for: the body; if: else
};

struct Template {
    std::string origin;
    std::vector<Node> body;
};

// "<origin> line L: what" as Exit::invalid.
[[noreturn]] void fail_at(const std::string& origin, int line, const std::string& what);

}  // namespace hymoe::text::jinja

namespace hymoe::text::jinja {

// Where an expression is, for errors.
struct Where {
    const std::string& origin;
    int line;
};

// Values as Python and Jinja2 treat them (jinja_builtins.cpp).
bool truthy(const Value& v);
std::string to_text(const Value& v, const Where& at);  // {{ v }} and ~
bool equal(const Value& a, const Value& b);
std::string kind_name(const Value& v);  // "string", "list", ... for errors

// Filters, tests, methods and functions of the subset; anything else is an Exit::invalid error
// naming it as outside the subset.
Value apply_filter(const std::string& name, const Value& v, const List& args, const Where& at);
bool apply_test(const std::string& name, const Value& v, const Where& at);
Value call_method(const Value& obj, const std::string& name, const List& args, const Where& at);
Value call_function(const std::string& name,
                    const List& args,
                    const std::vector<std::pair<std::string, Value>>& kwargs,
                    const Where& at);

}  // namespace hymoe::text::jinja
