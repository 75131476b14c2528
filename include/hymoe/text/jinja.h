// A subset of Jinja2 for HF chat templates (tokenizer_config.json "chat_template"). Debian
// bookworm ships no C++ Jinja library (`apt-cache search jinja`: Python, Rust and R packages
// only, no libinja-dev or jinja2cpp), so hymoe interprets the part real chat templates use, with
// HF's environment (trim_blocks, lstrip_blocks, keep_trailing_newline off) and Python semantics
// for values (lists and dicts are shared by reference). The subset (docs/guide/chat-templates.md):
//   tags:        {{ }}, {% %}, {# #}, whitespace control with - (and + against lstrip_blocks)
//   statements:  if/elif/else/endif, for x in list/endfor (loop.index0, index, first, last,
//                length, revindex, revindex0), set x = e, set ns.attr = e
//   expressions: string, integer, true/false/none literals, [lists], ( ), + - * ~, comparisons,
//                and/or/not, in/not in, a if c else b, x.attr, x[i], x[a:b:c], calls
//   tests:       defined, undefined, none, string, number, boolean, mapping, sequence
//   filters:     trim, length, default (d), upper, lower, string
//   methods:     str.startswith, endswith, split, strip, lstrip, rstrip; dict.get
//   functions:   namespace(k=v, ...), range(...), raise_exception(msg)
// Anything else is an Exit::invalid error "<origin> line L: <the construct> is outside hymoe's
// Jinja subset": at parse time for tags and syntax, at render time for filters, tests, methods and
// functions (so a template's tools branch using tojson parses and renders while tools is none).
// raise_exception(msg) is Exit::bad_input "<origin> line L: the template raised: msg".
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace hymoe::text::jinja {

struct Value;
using List = std::vector<Value>;
using Dict = std::map<std::string, Value>;

struct Value {
    enum class Kind { undefined, none, boolean, integer, string, list, dict, ns };
    Kind kind = Kind::undefined;
    bool b = false;
    int64_t i = 0;
    std::string s;
    std::shared_ptr<List> list;  // list: shared, as Python's
    std::shared_ptr<Dict> dict;  // dict and namespace (ns: attributes assignable by set)

    static Value none() { return with(Kind::none); }
    static Value boolean(bool v) { return with(Kind::boolean, v); }
    static Value integer(int64_t v);
    static Value string(std::string v);
    static Value of_list(List v);
    static Value of_dict(Dict v, Kind kind = Kind::dict);

private:
    static Value with(Kind k, bool v = false) {
        Value x;
        x.kind = k, x.b = v;
        return x;
    }
};

struct Template;  // parsed (jinja_ast.h)

// Parse a template; origin names it in errors ("path/tokenizer_config.json: chat_template").
std::shared_ptr<const Template> parse(const std::string& source, const std::string& origin);
// Render with these global variables.
std::string render(const Template& t, const Dict& globals);

}  // namespace hymoe::text::jinja
