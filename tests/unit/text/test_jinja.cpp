// The Jinja subset (text/jinja.h) by hand: HF's whitespace rules (trim_blocks, lstrip_blocks,
// - and +, the dropped trailing newline, CRLF), loops and their loop variables, set scoping and
// namespace(), expressions, filters, tests and methods against what Jinja2 gives, and the errors
// (constructs outside the subset, unclosed tags, raise_exception) with their lines. Then the
// real chat templates (tests/text/chat/: Kimi K2's and DeepSeek V3.1's, copied from llama.cpp's
// models/templates, whose tokenizer_config.json files name the source) rendered byte for byte
// and cut into loss-mask pieces.
#include <functional>

#include <boost/test/unit_test.hpp>

#include "hymoe/core/error.h"
#include "hymoe/text/chat.h"
#include "hymoe/text/jinja.h"

using namespace hymoe;
using namespace hymoe::text;
using jinja::Value;

namespace {

std::string run(const std::string& src, jinja::Dict globals = {}) {
    return jinja::render(*jinja::parse(src, "t"), globals);
}

std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const Error& e) {
        return cat(static_cast<int>(e.code()), " ", e.what());
    }
    return "no error";
}

Value strings(std::vector<std::string> xs) {
    jinja::List l;
    for (auto& x : xs)
        l.push_back(Value::string(x));
    return Value::of_list(l);
}

const std::vector<ChatMessage> kChat = {
    {"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello."}, {"user", "2+2?"}};

std::string targets(const std::vector<ChatPiece>& pieces) {
    std::string s;
    for (const auto& p : pieces)
        if (p.target)
            s += "[" + p.text + "]";
    return s;
}

std::string joined(const std::vector<ChatPiece>& pieces) {
    std::string s;
    for (const auto& p : pieces)
        s += p.text;
    return s;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(jinja_subset)

BOOST_AUTO_TEST_CASE(whitespace_as_hf_sets_it) {
    // trim_blocks drops the newline after a block tag; lstrip_blocks the indent before it.
    BOOST_TEST(run("  {% if true %}\nA\n  {% endif %}\nB") == "A\nB");
    BOOST_TEST(run("{% if true %}\n  x\n{% endif %}\n") == "  x\n");
    BOOST_TEST(run("x  {% if true %}y{% endif %}") == "x  y");  // not at a line's start
    BOOST_TEST(run("  {{ 'v' }}") == "  v");                    // not for {{ }}
    BOOST_TEST(run("  {%+ if true %}x{% endif %}") == "  x");   // + keeps the indent
    BOOST_TEST(run("a \n {%- if true -%} \n b {%- endif %}") == "ab");
    BOOST_TEST(run("{{- ' v ' -}}  \n") == " v ");
    BOOST_TEST(run("{# note #}\nA {#- x -#} B") == "AB");
    BOOST_TEST(run("{{ 'x' }}\n") == "x");  // one trailing newline dropped
    BOOST_TEST(run("{{ 'x' }}\n\n") == "x\n");
    BOOST_TEST(run("{% if true %}\r\nA\r\n{% endif %}\r\n") == "A\n");
}

BOOST_AUTO_TEST_CASE(loops_and_scopes) {
    BOOST_TEST(run("{% for m in xs %}{{ loop.index0 }}{{ loop.index }}{{ loop.first }}"
                   "{{ loop.last }}{{ loop.length }}{{ loop.revindex }}{{ m }},{% endfor %}",
                   {{"xs", strings({"a", "b"})}}) == "01TrueFalse22a,12FalseTrue21b,");
    BOOST_TEST(run("{% for m in nothing %}x{% endfor %}") == "");
    // A set inside a loop stays there; a namespace carries state out.
    BOOST_TEST(run("{% set x = 1 %}{% for i in [1, 2] %}{% set x = x + i %}{{ x }}{% endfor %}"
                   "{{ x }}") == "231");
    BOOST_TEST(run("{% set ns = namespace(n=0, s='') %}{% for i in [1, 2, 3] %}"
                   "{% set ns.n = ns.n + i %}{% set ns.s = ns.s ~ i %}{% endfor %}"
                   "{{ ns.n }} {{ ns.s }}") == "6 123");
    BOOST_TEST(run("{% if false %}a{% elif 0 %}b{% elif 'x' %}c{% else %}d{% endif %}") == "c");
    BOOST_TEST(run("{% if [] %}a{% else %}b{% endif %}") == "b");
    BOOST_TEST(run("{% for i in range(3) %}{{ i }}{% endfor %}{% for i in range(4, 0, -2) %}"
                   "{{ i }}{% endfor %}") == "01242");
}

BOOST_AUTO_TEST_CASE(expressions_filters_tests_methods) {
    const jinja::Dict g = {
        {"m", Value::of_dict({{"role", Value::string("user")}, {"n", Value::none()}})},
        {"xs", strings({"a", "b", "c"})}};
    BOOST_TEST(run("{{ 'a' + 'b' ~ 1 ~ none ~ true }}") == "ab1NoneTrue");
    BOOST_TEST(run("{{ m.role }}{{ m['role'] }}{{ m.nope }}|{{ m.nope is defined }}", g) ==
               "useruser|False");
    BOOST_TEST(run("{{ not m.nope is defined }}{{ m.n is none }}{{ m.n is not none }}"
                   "{{ m.role is string }}{{ m is mapping }}{{ xs is sequence }}",
                   g) == "TrueTrueFalseTrueTrueTrue");
    BOOST_TEST(run("{{ 'b' in xs }}{{ 'z' not in xs }}{{ 'ol' in m.role ~ 'ol' }}{{ 'role' in m }}",
                   g) == "TrueTrueTrueTrue");
    BOOST_TEST(run("{{ 1 < 2 and 2 <= 2 and 3 > 2 >= 2 and 1 != 2 and 'a' < 'b' }}") == "True");
    BOOST_TEST(run("{{ 1 < 3 < 2 }}{{ 3 > 2 > 1 }}") == "FalseTrue");  // chained as in Python
    BOOST_TEST(run("{{ 0 or 'x' }}{{ 1 and 'y' }}{{ -(2 * 3) + 1 }}") == "xy-5");
    BOOST_TEST(run("{{ 'y' if xs|length > 2 else 'n' }}{{ 'y' if false }}|", g) == "y|");
    BOOST_TEST(run("{{ xs[1:]|length }}{{ xs[-1] }}{{ xs[::-1][0] }}{{ xs[5] }}"
                   "{{ (xs + ['d'])|length }}",
                   g) == "2cc4");
    BOOST_TEST(run("{{ '  s \n'|trim }}|{{ x|default('d') }}{{ ''|default('e') }}"
                   "{{ ''|d('f', true) }}{{ 'Ab'|upper }}{{ 'Ab'|lower }}{{ 'é'|length }}") ==
               "s|dfABab1");
    BOOST_TEST(
        run("{{ 'a</think>b</think>c'.split('</think>', 1)[1] }}|{{ ' a  b '.split()|length }}"
            "|{{ 'a,b'.split(',')[0] }}") == "b</think>c|2|a");
    BOOST_TEST(run("{{ 'xhix'.strip('x') }}{{ '  a '.lstrip() }}.{{ ' a '.rstrip() }}.") ==
               "hia . a.");
    BOOST_TEST(run("{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith('bc') }}"
                   "{{ m.get('role') }}{{ m.get('x', 'dflt') }}{{ m.get('x') }}",
                   g) == "TrueTrueuserdfltNone");
}

BOOST_AUTO_TEST_CASE(errors_name_the_line_and_construct) {
    BOOST_TEST(error_of([] { jinja::parse("a\n\n{% macro f() %}{% endmacro %}", "cfg.json"); }) ==
               "2 cfg.json line 3: the tag {% macro %} is outside hymoe's Jinja subset (if, "
               "elif, else, for, set)");
    BOOST_TEST(error_of([] { jinja::parse("{% if x %}\n{% for y in z %}\n{% endif %}", "t"); }) ==
               "2 t line 3: {% endif %} inside the {% for %} of line 2, which is not closed");
    BOOST_TEST(error_of([] { jinja::parse("\n{% if x %}a", "t"); }) ==
               "2 t line 2: the tag is never closed by {% endif %}");
    BOOST_TEST(error_of([] { jinja::parse("x\n{% endfor %}", "t"); }) ==
               "2 t line 2: {% endfor %} without its opening tag");
    BOOST_TEST(error_of([] { jinja::parse("{{ 'a' \n", "t"); }) ==
               "2 t line 1: the tag is not closed");
    BOOST_TEST(error_of([] { jinja::parse("\n{{ {'a': 1} }}", "t"); }) ==
               "2 t line 2: a dict literal is outside hymoe's Jinja subset before '{'");
    BOOST_TEST(error_of([] { jinja::parse("{{ '\\u4e2d' }}", "t"); }) ==
               "2 t line 1: the escape \\u is outside hymoe's Jinja subset");
    BOOST_TEST(run("{{ 'a\\'b\\n' ~ \"\\\"\" }}") == "a'b\n\"");
    BOOST_TEST(error_of([] { jinja::parse("{{ 1.5 }}", "t"); }) ==
               "2 t line 1: a float literal is outside hymoe's Jinja subset");
    BOOST_TEST(error_of([] { jinja::parse("{{ 1 / 2 }}", "t"); }) ==
               "2 t line 1: the operator '/' is outside hymoe's Jinja subset before '/'");
    BOOST_TEST(error_of([] {
                   jinja::parse("{% set x %}y{% endset %}", "t");
               }).find("t line 1: a block set") == 2u);
    BOOST_TEST(error_of([] { jinja::parse("{% for x in xs if x %}{% endfor %}", "t"); }) ==
               "2 t line 1: a for loop's filter or recursive is outside hymoe's Jinja subset "
               "before 'if'");
    BOOST_TEST(error_of([] {
                   jinja::parse("{% for k, v in d %}{% endfor %}", "t");
               }).find("t line 1: unpacking in a for loop") == 2u);
    // Filters, tests, methods and functions are checked when they run: a template's tools
    // branch may use tojson while tools is none.
    BOOST_TEST(run("{% if tools %}{{ tools | tojson }}{% endif %}", {{"tools", Value::none()}}) ==
               "");
    BOOST_TEST(error_of([] { run("\n{{ [1] | tojson }}"); }) ==
               "2 t line 2: the filter 'tojson' is outside hymoe's Jinja subset");
    BOOST_TEST(error_of([] { run("{{ 1 is divisibleby }}"); }) ==
               "2 t line 1: the test 'divisibleby' is outside hymoe's Jinja subset");
    BOOST_TEST(error_of([] { run("\n\n{{ 'a'.title() }}"); }) ==
               "2 t line 3: the method string.title() is outside hymoe's Jinja subset");
    BOOST_TEST(error_of([] { run("{{ strftime_now('%Y') }}"); }) ==
               "2 t line 1: the function 'strftime_now' is outside hymoe's Jinja subset");
    BOOST_TEST(error_of([] { run("{{ x.y }}"); }) ==
               "2 t line 1: the attribute 'y' of an undefined value");
    BOOST_TEST(error_of([] { run("{{ [1] }}"); }) ==
               "2 t line 1: printing a list is outside hymoe's Jinja subset");
    BOOST_TEST(error_of([] { run("{{ 'a' + 1 }}"); }) == "2 t line 1: a string + a integer");
    BOOST_TEST(error_of([] { run("{% set x = 1 %}{% set x.a = 2 %}"); }) ==
               "2 t line 1: set x.a: x is a integer, not a namespace()");
    BOOST_TEST(error_of([] { run("a\n{{ raise_exception('roles must alternate') }}"); }) ==
               "3 t line 2: the template raised: roles must alternate");
}

// A template comes from a model folder: hostile ones end in one error, not in a crash, an
// overflow or a run that never ends (the limits of jinja_parser.cpp and jinja_eval.cpp; the
// fuzz_jinja target hunts for more).
BOOST_AUTO_TEST_CASE(hostile_templates_meet_the_limits) {
    BOOST_TEST(error_of([] { jinja::parse("{{ 99999999999999999999 }}", "t"); }) ==
               "2 t line 1: the integer 99999999999999999999 overflows 64 bits");
    BOOST_TEST(run("{{ 9223372036854775807 - 1 + 1 }}{{ -9223372036854775807 - 1 }}") ==
               "9223372036854775807-9223372036854775808");
    BOOST_TEST(error_of([] { run("{{ 9223372036854775807 + 1 }}"); }) ==
               "2 t line 1: an integer overflows 64 bits");
    BOOST_TEST(error_of([] { run("\n{{ 4294967296 * 4294967296 }}"); }) ==
               "2 t line 2: an integer overflows 64 bits");
    BOOST_TEST(error_of([] { run("{{ -(-9223372036854775807 - 1) }}"); }) ==
               "2 t line 1: an integer overflows 64 bits");
    // slices with steps beyond the list, as Python gives them
    BOOST_TEST(run("{{ [1, 2, 3][1::9223372036854775807]|length }}"
                   "{{ [1, 2, 3][::-9223372036854775807 - 1][0] }}"
                   "{{ [1, 2, 3][-9223372036854775807:9223372036854775807:2]|length }}") == "132");
    BOOST_TEST(error_of([] { jinja::parse("{{ xs[] }}", "t"); }) ==
               "2 t line 1: an empty subscript [] at the end of the tag");
    const std::string deep = std::string(101, '(') + "1" + std::string(101, ')');
    BOOST_TEST(error_of([&] {
                   jinja::parse("{{ " + deep + " }}", "t");
               }).find("2 t line 1: an expression nested over 100 deep") == 0u);
    BOOST_TEST(run("{{ " + std::string(99, '(') + "1" + std::string(99, ')') + " }}") == "1");
    std::string blocks;
    for (int i = 0; i < 101; ++i)
        blocks += "{% if true %}";
    BOOST_TEST(error_of([&] { jinja::parse(blocks, "t"); }) ==
               "2 t line 1: blocks nested over 100 deep");
    BOOST_TEST(error_of([] {
                   run("{% for i in range(128) %}{% for j in range(129) %}{% endfor %}"
                       "{% endfor %}");
               }) == "2 t line 1: the template runs over 16384 loop iterations");
    BOOST_TEST(error_of([] {
                   run("{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}"
                       "{% for i in range(30) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}");
               }) == "2 t line 1: a string over 64 MiB");
    BOOST_TEST(error_of([] {
                   run("{% set ns = namespace(l=range(1024)) %}"
                       "{% for i in range(30) %}{% set ns.l = ns.l + ns.l %}{% endfor %}");
               }) == "2 t line 1: a list over 4194304 items");
}

BOOST_AUTO_TEST_CASE(real_templates_render_as_the_presets) {
    const ChatTemplate kimi = load_hf_chat_template("tests/text/chat/kimi-k2");
    const ChatTemplate ds = load_hf_chat_template("tests/text/chat/deepseek-v3.1");
    BOOST_TEST(kimi.jinja_bos == "[BOS]");
    BOOST_TEST(ds.jinja_bos == "<｜begin▁of▁sentence｜>");  // from an AddedToken object
    BOOST_TEST(ds.jinja_eos == "<｜end▁of▁sentence｜>");
    // With a system message both equal the presets byte for byte.
    BOOST_TEST(render_chat(kimi, kChat) == render_chat(chat_preset("kimi"), kChat));
    BOOST_TEST(render_chat(ds, kChat) == render_chat(chat_preset("deepseek"), kChat));
    BOOST_TEST(render_chat(ds, kChat) ==
               "<｜begin▁of▁sentence｜>Be brief.<｜User｜>Hi<｜Assistant｜></think>Hello."
               "<｜end▁of▁sentence｜><｜User｜>2+2?<｜Assistant｜></think>");
    // Without one, Kimi's template writes its default system prompt (the preset does not).
    const std::vector<ChatMessage> bare = {{"user", "Hi"}};
    BOOST_TEST(render_chat(kimi, bare) ==
               "<|im_system|>system<|im_middle|>You are a helpful assistant<|im_end|>"
               "<|im_user|>user<|im_middle|>Hi<|im_end|><|im_assistant|>assistant<|im_middle|>");
    BOOST_TEST(render_hf_chat(kimi, bare, false) ==
               "<|im_system|>system<|im_middle|>You are a helpful assistant<|im_end|>"
               "<|im_user|>user<|im_middle|>Hi<|im_end|>");
    // DeepSeek: two system messages joined by a blank line; reasoning before </think> dropped.
    BOOST_TEST(render_chat(ds,
                           {{"system", "A"},
                            {"system", "B"},
                            {"user", "u"},
                            {"assistant", "<think>hmm</think>Yes."},
                            {"user", "v"}}) ==
               "<｜begin▁of▁sentence｜>A\n\nB<｜User｜>u<｜Assistant｜></think>Yes."
               "<｜end▁of▁sentence｜><｜User｜>v<｜Assistant｜></think>");
}

BOOST_AUTO_TEST_CASE(real_templates_give_the_loss_mask_pieces) {
    for (const char* name : {"kimi", "deepseek"}) {
        const ChatTemplate t =
            load_hf_chat_template(std::string("tests/text/chat/") +
                                  (name == std::string("kimi") ? "kimi-k2" : "deepseek-v3.1"));
        const std::vector<ChatMessage> m(kChat.begin(), kChat.begin() + 3);
        const auto pieces = chat_pieces(t, m);
        const auto preset = chat_pieces(chat_preset(name), m);
        BOOST_TEST(joined(pieces) == joined(preset));
        BOOST_TEST(targets(pieces) == targets(preset));
    }
    const ChatTemplate kimi = load_hf_chat_template("tests/text/chat/kimi-k2");
    BOOST_TEST(targets(chat_pieces(kimi, kChat)) == "[Hello.<|im_end|>]");
    // Two assistant turns, each its own target.
    BOOST_TEST(targets(chat_pieces(
                   kimi, {{"user", "a"}, {"assistant", "b"}, {"user", "c"}, {"assistant", "d"}})) ==
               "[b<|im_end|>][d<|im_end|>]");
}

BOOST_AUTO_TEST_CASE(templates_the_pieces_cannot_cut_are_refused) {
    // A template that renders the last message differently from the earlier ones (here it
    // marks the last) makes a rendering that does not extend the previous one.
    ChatTemplate t;
    t.source = "x/tokenizer_config.json";
    t.jinja = jinja::parse(
        "{% for m in messages %}{{ m.content }}{% if loop.last %}!{% endif %}{% endfor %}", "t");
    BOOST_TEST(error_of([&] {
                   chat_pieces(t, {{"user", "a"}, {"assistant", "b"}});
               }) ==
               "2 x/tokenizer_config.json: chat_template: the conversation up to message 2 does "
               "not render as a continuation of the one before it, so the assistant's text "
               "cannot be cut out for the loss mask (use a preset)");
    BOOST_TEST(error_of([] { load_hf_chat_template("tests/text"); }) ==
               "2 tests/text/tokenizer_config.json: cannot read it (tokenizer.chat: template "
               "reads the chat_template there)");
}

BOOST_AUTO_TEST_SUITE_END()
