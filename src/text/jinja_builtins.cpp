// The Jinja subset's values and built-ins (jinja_ast.h): truth, printing and equality as in
// Python; the filters, tests, string and dict methods and global functions that HF chat
// templates use (the list is in text/jinja.h).
#include <algorithm>

#include "hymoe/core/error.h"
#include "jinja_ast.h"

namespace hymoe::text::jinja {

Value Value::integer(int64_t v) {
    Value x;
    x.kind = Kind::integer, x.i = v;
    return x;
}
Value Value::string(std::string v) {
    Value x;
    x.kind = Kind::string, x.s = std::move(v);
    return x;
}
Value Value::of_list(List v) {
    Value x;
    x.kind = Kind::list, x.list = std::make_shared<List>(std::move(v));
    return x;
}
Value Value::of_dict(Dict v, Kind kind) {
    Value x;
    x.kind = kind, x.dict = std::make_shared<Dict>(std::move(v));
    return x;
}

namespace {

using K = Value::Kind;

[[noreturn]] void outside(const Where& at, const std::string& what) {
    fail_at(at.origin, at.line, what + " is outside hymoe's Jinja subset");
}

const std::string& text_arg(const List& args, size_t i, const std::string& fn, const Where& at) {
    if (i >= args.size() || args[i].kind != K::string)
        fail_at(at.origin, at.line, cat(fn, " expects a string as argument ", i + 1));
    return args[i].s;
}

// Code points of valid UTF-8 (Python's len of a str).
int64_t utf8_length(const std::string& s) {
    return std::count_if(
        s.begin(), s.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; });
}

bool is_ws(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

// Python's str.strip / lstrip / rstrip (chars empty: whitespace).
std::string strip(const std::string& s, const std::string& chars, bool left, bool right) {
    auto drop = [&](char c) {
        return chars.empty() ? is_ws(c) : chars.find(c) != std::string::npos;
    };
    size_t a = 0, b = s.size();
    while (left && a < b && drop(s[a]))
        ++a;
    while (right && b > a && drop(s[b - 1]))
        --b;
    return s.substr(a, b - a);
}

// Python's str.split(sep, maxsplit); sep empty: runs of whitespace.
List split(const std::string& s, const std::string& sep, int64_t maxsplit) {
    List out;
    if (sep.empty()) {
        size_t i = 0;
        while (true) {
            while (i < s.size() && is_ws(s[i]))
                ++i;
            if (i >= s.size())
                break;
            if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
                out.push_back(Value::string(strip(s.substr(i), "", false, true)));
                break;
            }
            size_t j = i;
            while (j < s.size() && !is_ws(s[j]))
                ++j;
            out.push_back(Value::string(s.substr(i, j - i)));
            i = j;
        }
        return out;
    }
    size_t from = 0;
    for (size_t at; (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) &&
                    (at = s.find(sep, from)) != std::string::npos;
         from = at + sep.size())
        out.push_back(Value::string(s.substr(from, at - from)));
    out.push_back(Value::string(s.substr(from)));
    return out;
}

}  // namespace

bool truthy(const Value& v) {
    switch (v.kind) {
        case K::undefined:
        case K::none:
            return false;
        case K::boolean:
            return v.b;
        case K::integer:
            return v.i != 0;
        case K::string:
            return !v.s.empty();
        case K::list:
            return !v.list->empty();
        case K::dict:
            return !v.dict->empty();
        case K::ns:
            return true;
    }
    return false;
}

std::string kind_name(const Value& v) {
    static const char* names[] = {
        "undefined", "none", "boolean", "integer", "string", "list", "dict", "namespace"};
    return names[static_cast<int>(v.kind)];
}

std::string to_text(const Value& v, const Where& at) {
    switch (v.kind) {
        case K::undefined:
            return "";
        case K::none:
            return "None";
        case K::boolean:
            return v.b ? "True" : "False";
        case K::integer:
            return std::to_string(v.i);
        case K::string:
            return v.s;
        default:
            outside(at, "printing a " + kind_name(v));
    }
}

bool equal(const Value& a, const Value& b) {
    const bool num_a = a.kind == K::integer || a.kind == K::boolean;
    const bool num_b = b.kind == K::integer || b.kind == K::boolean;
    if (num_a && num_b)  // Python: True == 1
        return (a.kind == K::boolean ? a.b : a.i) == (b.kind == K::boolean ? b.b : b.i);
    if (a.kind != b.kind)
        return false;
    switch (a.kind) {
        case K::string:
            return a.s == b.s;
        case K::list:
            return std::equal(
                a.list->begin(), a.list->end(), b.list->begin(), b.list->end(), equal);
        case K::dict:
            return std::equal(a.dict->begin(),
                              a.dict->end(),
                              b.dict->begin(),
                              b.dict->end(),
                              [](const auto& x, const auto& y) {
                                  return x.first == y.first && equal(x.second, y.second);
                              });
        case K::ns:
            return a.dict == b.dict;
        default:
            return true;  // undefined, none
    }
}

Value apply_filter(const std::string& name, const Value& v, const List& args, const Where& at) {
    if (name == "default" || name == "d") {
        const bool boolean = args.size() > 1 && truthy(args[1]);
        if (v.kind == K::undefined || (boolean && !truthy(v)))
            return args.empty() ? Value::string("") : args[0];
        return v;
    }
    if (name == "length" || name == "count") {
        if (v.kind == K::string)
            return Value::integer(utf8_length(v.s));
        if (v.kind == K::list)
            return Value::integer(static_cast<int64_t>(v.list->size()));
        if (v.kind == K::dict)
            return Value::integer(static_cast<int64_t>(v.dict->size()));
        fail_at(at.origin, at.line, "length of a " + kind_name(v));
    }
    if (name == "string")
        return Value::string(to_text(v, at));
    if (name == "trim" || name == "upper" || name == "lower") {
        if (v.kind != K::string)
            fail_at(at.origin, at.line, cat("the filter ", name, " of a ", kind_name(v)));
        std::string s = v.s;
        if (name == "trim")
            return Value::string(strip(s, "", true, true));
        for (char& c : s)
            c = static_cast<char>(name == "upper" ? std::toupper(static_cast<unsigned char>(c))
                                                  : std::tolower(static_cast<unsigned char>(c)));
        return Value::string(s);
    }
    outside(at, "the filter '" + name + "'");
}

bool apply_test(const std::string& name, const Value& v, const Where& at) {
    if (name == "defined")
        return v.kind != K::undefined;
    if (name == "undefined")
        return v.kind == K::undefined;
    if (name == "none")
        return v.kind == K::none;
    if (name == "string")
        return v.kind == K::string;
    if (name == "number")
        return v.kind == K::integer;
    if (name == "boolean")
        return v.kind == K::boolean;
    if (name == "mapping")
        return v.kind == K::dict;
    if (name == "sequence")
        return v.kind == K::string || v.kind == K::list || v.kind == K::dict;
    outside(at, "the test '" + name + "'");
}

Value call_method(const Value& obj, const std::string& name, const List& args, const Where& at) {
    const std::string fn = kind_name(obj) + "." + name;
    if (obj.kind == K::string) {
        if (name == "startswith")
            return Value::boolean(obj.s.starts_with(text_arg(args, 0, fn, at)));
        if (name == "endswith")
            return Value::boolean(obj.s.ends_with(text_arg(args, 0, fn, at)));
        if (name == "strip" || name == "lstrip" || name == "rstrip") {
            const std::string chars =
                args.empty() || args[0].kind == K::none ? "" : text_arg(args, 0, fn, at);
            return Value::string(strip(obj.s, chars, name != "rstrip", name != "lstrip"));
        }
        if (name == "split") {
            const std::string sep =
                args.empty() || args[0].kind == K::none ? "" : text_arg(args, 0, fn, at);
            if (args.size() > 1 && args[1].kind != K::integer)
                fail_at(at.origin, at.line, fn + " expects an integer maxsplit");
            if (!args.empty() && args[0].kind == K::string && sep.empty())
                fail_at(at.origin, at.line, fn + ": empty separator");
            return Value::of_list(split(obj.s, sep, args.size() > 1 ? args[1].i : -1));
        }
    }
    if (obj.kind == K::dict && name == "get") {
        const auto it = obj.dict->find(text_arg(args, 0, fn, at));
        return it != obj.dict->end() ? it->second : args.size() > 1 ? args[1] : Value::none();
    }
    outside(at, "the method " + fn + "()");
}

Value call_function(const std::string& name,
                    const List& args,
                    const std::vector<std::pair<std::string, Value>>& kwargs,
                    const Where& at) {
    if (name == "raise_exception") {
        const std::string msg = args.empty() ? "" : to_text(args[0], at);
        HYMOE_FAIL(Exit::bad_input, at.origin, " line ", at.line, ": the template raised: ", msg);
    }
    if (name == "namespace") {
        if (!args.empty())
            outside(at, "namespace() with positional arguments");
        Dict d;
        for (const auto& [k, v] : kwargs)
            d[k] = v;
        return Value::of_dict(std::move(d), K::ns);
    }
    if (name == "range") {
        if (args.empty() || args.size() > 3 || !kwargs.empty() ||
            std::any_of(
                args.begin(), args.end(), [](const Value& a) { return a.kind != K::integer; }))
            fail_at(at.origin, at.line, "range expects 1 to 3 integers");
        const int64_t start = args.size() > 1 ? args[0].i : 0;
        const int64_t stop = args.size() > 1 ? args[1].i : args[0].i;
        const int64_t step = args.size() > 2 ? args[2].i : 1;
        if (step == 0)
            fail_at(at.origin, at.line, "range() step is 0");
        List out;
        for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
            if (out.size() >= (1u << 20))
                fail_at(at.origin, at.line, "range() over 2^20 items");
            out.push_back(Value::integer(i));
        }
        return Value::of_list(std::move(out));
    }
    outside(at, "the function '" + name + "'");
}

}  // namespace hymoe::text::jinja
