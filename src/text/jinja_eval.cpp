// The Jinja subset's evaluator (text/jinja.h): runs the syntax tree against the globals and
// writes the output. Scopes as in Jinja2: a for loop's body is a scope of its own, so a set inside
// a loop is gone after it (templates carry state out of loops in namespace() objects); if does not
// open a scope. An undefined name is Undefined: false, printed as "", `is defined` false; its
// attributes and items are errors, as in Jinja2. A template from a model folder is untrusted: its
// integers may not overflow, and one render runs at most 2^14 loop iterations, writes at most
// 64 MiB and builds lists of at most 2^22 items (real chat templates need a few per message).
#include <algorithm>

#include "hymoe/core/error.h"
#include "jinja_ast.h"

namespace hymoe::text::jinja {

namespace {

using K = Value::Kind;

constexpr int64_t kMaxIterations = int64_t{1} << 14;
constexpr size_t kMaxText = size_t{64} << 20;
constexpr size_t kMaxItems = size_t{1} << 22;

class Renderer {
public:
    Renderer(const Template& t, const Dict& globals) : t_(t) {
        scopes_.push_back(globals);
        scopes_.emplace_back();  // the template's own sets
    }
    std::string run() {
        exec(t_.body);
        return std::move(out_);
    }

private:
    Where at(int line) const { return {t_.origin, line}; }
    [[noreturn]] void fail(int line, const std::string& what) const {
        fail_at(t_.origin, line, what);
    }

    Value lookup(const std::string& name) const {
        for (auto s = scopes_.rbegin(); s != scopes_.rend(); ++s)
            if (auto it = s->find(name); it != s->end())
                return it->second;
        return {};
    }

    void exec(const std::vector<Node>& nodes) {
        for (const Node& n : nodes)
            exec(n);
    }

    void exec(const Node& n) {
        switch (n.kind) {
            case Node::Kind::text:
                return write(n.text, n.line);
            case Node::Kind::output:
                return write(to_text(eval(*n.expr), at(n.line)), n.line);
            case Node::Kind::if_:
                for (const auto& [cond, body] : n.branches)
                    if (truthy(eval(*cond)))
                        return exec(body);
                return exec(n.body);
            case Node::Kind::for_:
                return loop(n);
            case Node::Kind::set: {
                Value v = eval(*n.expr);
                if (n.attr.empty()) {
                    scopes_.back()[n.var] = std::move(v);
                    return;
                }
                const Value target = lookup(n.var);
                if (target.kind != K::ns)
                    fail(n.line,
                         cat("set ",
                             n.var,
                             ".",
                             n.attr,
                             ": ",
                             n.var,
                             " is a ",
                             kind_name(target),
                             ", not a namespace()"));
                (*target.dict)[n.attr] = std::move(v);
                return;
            }
        }
    }

    void write(const std::string& text, int line) {
        out_ += text;
        if (out_.size() > kMaxText)
            fail(line, cat("the template writes over ", kMaxText >> 20, " MiB"));
    }

    void loop(const Node& n) {
        const Value seq = eval(*n.expr);
        if (seq.kind == K::undefined)
            return;
        if (seq.kind != K::list)
            fail(n.line,
                 "a for loop over a " + kind_name(seq) + " is outside hymoe's Jinja subset");
        const List items = *seq.list;  // a snapshot, as Python iterates a list being appended to
        const auto len = static_cast<int64_t>(items.size());
        for (int64_t i = 0; i < len; ++i) {
            if (++iterations_ > kMaxIterations)
                fail(n.line, cat("the template runs over ", kMaxIterations, " loop iterations"));
            Dict loop = {{"index0", Value::integer(i)},
                         {"index", Value::integer(i + 1)},
                         {"revindex0", Value::integer(len - 1 - i)},
                         {"revindex", Value::integer(len - i)},
                         {"first", Value::boolean(i == 0)},
                         {"last", Value::boolean(i == len - 1)},
                         {"length", Value::integer(len)}};
            scopes_.push_back({{n.var, items[static_cast<size_t>(i)]},
                               {"loop", Value::of_dict(std::move(loop))}});
            exec(n.body);
            scopes_.pop_back();
        }
    }

    Value item(const Value& obj, const Value& key, int line) const {
        if (obj.kind == K::dict || obj.kind == K::ns) {
            if (key.kind != K::string)
                return {};
            auto it = obj.dict->find(key.s);
            return it == obj.dict->end() ? Value{} : it->second;
        }
        if (obj.kind == K::list && key.kind == K::integer) {
            const auto n = static_cast<int64_t>(obj.list->size());
            const int64_t i = key.i < 0 ? key.i + n : key.i;
            return i < 0 || i >= n ? Value{} : (*obj.list)[static_cast<size_t>(i)];
        }
        if (obj.kind == K::undefined)
            fail(line, "an item of an undefined value");
        fail(line,
             cat("a ",
                 kind_name(key),
                 " item of a ",
                 kind_name(obj),
                 " is outside hymoe's Jinja subset"));
    }

    Value slice(const Expr& e) {
        const Value obj = eval(*e.args[0]);
        if (obj.kind != K::list)
            fail(e.line, "a slice of a " + kind_name(obj) + " is outside hymoe's Jinja subset");
        int64_t bound[3] = {0, 0, 1};
        bool given[3] = {false, false, false};
        for (int k = 0; k < 3; ++k)
            if (e.args[static_cast<size_t>(k + 1)]) {
                const Value v = eval(*e.args[static_cast<size_t>(k + 1)]);
                if (v.kind != K::integer && v.kind != K::none)
                    fail(e.line, "a slice bound must be an integer");
                given[k] = v.kind == K::integer, bound[k] = v.i;
            }
        const int64_t step = given[2] ? bound[2] : 1;
        if (step == 0)
            fail(e.line, "slice step is 0");
        // Python's slice.indices
        const auto n = static_cast<int64_t>(obj.list->size());
        auto clamp = [&](int64_t v, bool is_given, int64_t def) {
            if (!is_given)
                return def;
            if (v < 0)
                v += n;
            return step > 0 ? std::clamp<int64_t>(v, 0, n) : std::clamp<int64_t>(v, -1, n - 1);
        };
        const int64_t start = clamp(bound[0], given[0], step > 0 ? 0 : n - 1);
        const int64_t stop = clamp(bound[1], given[1], step > 0 ? n : -1);
        List out;
        // start, stop in [-1, n]: count · |step| stays within the list, whatever the step
        const int64_t span = step > 0 ? stop - start : start - stop;
        const uint64_t magnitude =
            step > 0 ? static_cast<uint64_t>(step) : 0 - static_cast<uint64_t>(step);
        const int64_t count =
            span > 0 ? static_cast<int64_t>((static_cast<uint64_t>(span) - 1) / magnitude) + 1 : 0;
        for (int64_t j = 0; j < count; ++j)
            out.push_back((*obj.list)[static_cast<size_t>(start + j * step)]);
        return Value::of_list(std::move(out));
    }

    Value call(const Expr& e) {
        List args;
        for (size_t k = 1; k < e.args.size(); ++k)
            args.push_back(eval(*e.args[k]));
        std::vector<std::pair<std::string, Value>> kwargs;
        for (const auto& [key, x] : e.kwargs)
            kwargs.emplace_back(key, eval(*x));
        const Expr& callee = *e.args[0];
        if (callee.kind == Expr::Kind::attr) {
            if (!kwargs.empty())
                fail(e.line, "keyword arguments to a method are outside hymoe's Jinja subset");
            const Value obj = eval(*callee.args[0]);
            if (obj.kind == K::undefined)
                fail(e.line, "the method " + callee.name + "() of an undefined value");
            return call_method(obj, callee.name, args, at(e.line));
        }
        if (callee.kind == Expr::Kind::name && lookup(callee.name).kind == K::undefined)
            return call_function(callee.name, args, kwargs, at(e.line));
        fail(e.line, "calling this value is outside hymoe's Jinja subset");
    }

    // a op b for op + - *, an error where it overflows int64 (Python's integers do not).
    Value arithmetic(char op, int64_t a, int64_t b, int line) const {
        int64_t r = 0;
        const bool overflow = op == '+'   ? __builtin_add_overflow(a, b, &r)
                              : op == '-' ? __builtin_sub_overflow(a, b, &r)
                                          : __builtin_mul_overflow(a, b, &r);
        if (overflow)
            fail(line, "an integer overflows 64 bits");
        return Value::integer(r);
    }
    Value text(std::string s, int line) const {
        if (s.size() > kMaxText)
            fail(line, cat("a string over ", kMaxText >> 20, " MiB"));
        return Value::string(std::move(s));
    }

    Value binary(const Expr& e) {
        const std::string& op = e.name;
        const Value a = eval(*e.args[0]);
        if (op == "and")
            return truthy(a) ? eval(*e.args[1]) : a;
        if (op == "or")
            return truthy(a) ? a : eval(*e.args[1]);
        const Value b = eval(*e.args[1]);
        if (op == "==" || op == "!=")
            return Value::boolean(equal(a, b) == (op == "=="));
        if (op == "~")
            return text(to_text(a, at(e.line)) + to_text(b, at(e.line)), e.line);
        if (op == "in" || op == "notin") {
            bool found = false;
            if (b.kind == K::string && a.kind == K::string)
                found = b.s.find(a.s) != std::string::npos;
            else if (b.kind == K::list)
                found = std::any_of(
                    b.list->begin(), b.list->end(), [&](const Value& x) { return equal(x, a); });
            else if (b.kind == K::dict && a.kind == K::string)
                found = b.dict->count(a.s) > 0;
            else
                fail(e.line, cat("'in' a ", kind_name(b), " (for a ", kind_name(a), ")"));
            return Value::boolean(found == (op == "in"));
        }
        if (a.kind == K::integer && b.kind == K::integer) {
            if (op == "+" || op == "-" || op == "*")
                return arithmetic(op[0], a.i, b.i, e.line);
            if (op == "<")
                return Value::boolean(a.i < b.i);
            if (op == ">")
                return Value::boolean(a.i > b.i);
            if (op == "<=")
                return Value::boolean(a.i <= b.i);
            if (op == ">=")
                return Value::boolean(a.i >= b.i);
        }
        if (a.kind == K::string && b.kind == K::string) {
            if (op == "+")
                return text(a.s + b.s, e.line);
            if (op == "<")
                return Value::boolean(a.s < b.s);
            if (op == ">")
                return Value::boolean(a.s > b.s);
            if (op == "<=")
                return Value::boolean(a.s <= b.s);
            if (op == ">=")
                return Value::boolean(a.s >= b.s);
        }
        if (a.kind == K::list && b.kind == K::list && op == "+") {
            if (a.list->size() + b.list->size() > kMaxItems)
                fail(e.line, cat("a list over ", kMaxItems, " items"));
            List out = *a.list;
            out.insert(out.end(), b.list->begin(), b.list->end());
            return Value::of_list(std::move(out));
        }
        fail(e.line, cat("a ", kind_name(a), " ", op, " a ", kind_name(b)));
    }

    Value eval(const Expr& e) {
        switch (e.kind) {
            case Expr::Kind::literal:
                return e.value;
            case Expr::Kind::name:
                return lookup(e.name);
            case Expr::Kind::list: {
                List items;
                for (const ExprPtr& x : e.args)
                    items.push_back(eval(*x));
                return Value::of_list(std::move(items));
            }
            case Expr::Kind::attr: {
                const Value obj = eval(*e.args[0]);
                if (obj.kind == K::undefined)
                    fail(e.line, "the attribute '" + e.name + "' of an undefined value");
                return obj.kind == K::dict || obj.kind == K::ns
                           ? item(obj, Value::string(e.name), e.line)
                           : Value{};
            }
            case Expr::Kind::index:
                return item(eval(*e.args[0]), eval(*e.args[1]), e.line);
            case Expr::Kind::slice:
                return slice(e);
            case Expr::Kind::call:
                return call(e);
            case Expr::Kind::filter: {
                List args;
                for (size_t k = 1; k < e.args.size(); ++k)
                    args.push_back(eval(*e.args[k]));
                return apply_filter(e.name, eval(*e.args[0]), args, at(e.line));
            }
            case Expr::Kind::test:
                return Value::boolean(apply_test(e.name, eval(*e.args[0]), at(e.line)) != e.negate);
            case Expr::Kind::unary: {
                const Value v = eval(*e.args[0]);
                if (e.name == "not")
                    return Value::boolean(!truthy(v));
                if (v.kind != K::integer)
                    fail(e.line, "minus a " + kind_name(v));
                return arithmetic('-', 0, v.i, e.line);
            }
            case Expr::Kind::binary:
                return binary(e);
            case Expr::Kind::ternary:
                if (truthy(eval(*e.args[1])))
                    return eval(*e.args[0]);
                return e.args[2] ? eval(*e.args[2]) : Value{};
        }
        return {};
    }

    const Template& t_;
    std::vector<Dict> scopes_;
    std::string out_;
    int64_t iterations_ = 0;
};

}  // namespace

std::string render(const Template& t, const Dict& globals) {
    return Renderer(t, globals).run();
}

}  // namespace hymoe::text::jinja
