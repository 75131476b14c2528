// Typed, checked reads from one YAML map of the deck (see reader.h).
#include "reader.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <sstream>

#include "hymoe/core/error.h"

namespace hymoe::deck {

namespace fs = std::filesystem;

namespace {

std::string join(const std::vector<std::string>& items) {
    std::string out;
    for (const auto& s : items)
        out += (out.empty() ? "" : ", ") + s;
    return out;
}

const char* type_name(const YAML::Node& n) {
    switch (n.Type()) {
        case YAML::NodeType::Map:
            return "a map";
        case YAML::NodeType::Sequence:
            return "a list";
        case YAML::NodeType::Null:
            return "no value";
        case YAML::NodeType::Scalar:
            return "a scalar";
        case YAML::NodeType::Undefined:
            return "nothing";
    }
    return "?";
}

constexpr int64_t kOpenEnded = int64_t{1} << 40;  // larger upper bounds are not worth printing

std::string range_text(int64_t lo, int64_t hi) {
    return hi >= kOpenEnded ? cat(">= ", lo) : cat(lo, " to ", hi);
}

std::string format_number(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.10g", v);
    return buf;
}

}  // namespace

std::string ParseContext::where(const YAML::Mark& mark, const std::string& path) const {
    // The --set that gave the key, or a map value around it (--set 'parallel={tp: 0}': its
    // marks are lines of the argument, not of the deck); the innermost one wins (the map is
    // ordered, so a key sorts after the sections around it).
    std::string given;
    for (const auto& [key, arg] : overrides)
        if (key == path || path.rfind(key + ".", 0) == 0)
            given = arg;
    if (!given.empty())
        return given;
    if (mark.line < 0) {  // a section that only exists because a --set below it made it
        for (const auto& [key, arg] : overrides)
            if (key.rfind(path + ".", 0) == 0)
                return arg;
        return cat(file, ":1:1");
    }
    return cat(file, ":", mark.line + 1, ":", mark.column + 1);
}

void ParseContext::fail(const YAML::Mark& mark,
                        const std::string& path,
                        const std::string& what) const {
    HYMOE_FAIL(Exit::invalid, where(mark, path), ": ", path, ": ", what);
}

Section::Section(
    ParseContext& ctx, YAML::Node node, YAML::Node resolved, std::string path, YAML::Mark mark)
    : ctx_(ctx), node_(node), resolved_(resolved), path_(std::move(path)), mark_(mark) {
    if (!node_.IsDefined() || node_.IsNull())
        return;
    if (!node_.IsMap())
        ctx_.fail(node_.Mark(), path_, cat("expected a map of keys, got ", type_name(node_)));
    const std::vector<std::string> known = section_keys(path_);
    for (auto it = node_.begin(); it != node_.end(); ++it) {
        if (!it->first.IsScalar())
            ctx_.fail(it->first.Mark(), path_, "keys must be plain words");
        std::string key = it->first.Scalar();
        if (std::find(known.begin(), known.end(), key) == known.end())
            ctx_.fail(
                it->first.Mark(), key_path(key), cat("unknown key (allowed: ", join(known), ")"));
        auto [prev, inserted] = key_marks_.emplace(key, it->first.Mark());
        if (!inserted)
            ctx_.fail(it->first.Mark(),
                      key_path(key),
                      cat("duplicate key (first given on line ", prev->second.line + 1, ")"));
        values_.emplace(key, it->second);
    }
}

std::string Section::key_path(const std::string& key) const {
    return path_.empty() ? key : path_ + "." + key;
}

YAML::Mark Section::mark_of(const std::string& key) const {
    auto it = values_.find(key);
    if (it != values_.end() && !it->second.IsNull() && it->second.Mark().line >= 0)
        return it->second.Mark();
    auto k = key_marks_.find(key);
    return k != key_marks_.end() ? k->second : mark_;
}

void Section::fail(const std::string& key, const std::string& what) const {
    ctx_.fail(mark_of(key), key_path(key), what);
}

void Section::record(const std::string& key) {
    (*ctx_.sources)[key_path(key)] = Source{ctx_.where(mark_of(key), key_path(key))};
}

bool Section::has(const std::string& key) const {
    auto it = values_.find(key);
    return it != values_.end() && !it->second.IsNull();
}

const YAML::Node* Section::find(const std::string& key) {
    read_.insert(key);
    record(key);
    auto it = values_.find(key);
    if (it == values_.end())
        return nullptr;
    if (it->second.IsNull())
        fail(key, "no value given");
    return &it->second;
}

const YAML::Node& Section::scalar(const std::string& key, const char* expected) {
    const YAML::Node& v = values_.at(key);
    if (!v.IsScalar())
        fail(key, cat("expected ", expected, ", got ", type_name(v)));
    return v;
}

const KeySpec& Section::spec(const std::string& key, KeyType type) const {
    const KeySpec& k = key_spec(key_path(key));
    HYMOE_CHECK(k.type == type, "deck key ", k.path, " is read as ", type_name(type));
    return k;
}

namespace {

int64_t to_bound(double v) {  // a table bound as an int64 (9.3e18 = the whole range)
    return v >= 9.2e18 ? INT64_MAX : static_cast<int64_t>(v);
}

}  // namespace

int64_t Section::integer(const std::string& key) {
    const KeySpec& k = spec(key, KeyType::integer);
    return integer_in(key, k.def ? std::optional<int64_t>(std::stoll(k.def)) : std::nullopt);
}

int64_t Section::integer_in(const std::string& key, std::optional<int64_t> def) {
    const KeySpec& k = key_spec(key_path(key));
    const int64_t lo = to_bound(k.lo), hi = to_bound(k.hi);
    const YAML::Node* v = find(key);
    int64_t x = 0;
    if (!v) {
        if (!def)
            fail(key, cat("required key is missing (an integer, ", range_text(lo, hi), ")"));
        x = *def;
    } else {
        const std::string& s = scalar(key, "an integer").Scalar();
        std::istringstream in(s);
        if (!(in >> x) || !in.eof())
            fail(key, cat("'", s, "' is not an integer (allowed: ", range_text(lo, hi), ")"));
        if (x < lo || x > hi)
            fail(key, cat(x, " is out of range (allowed: ", range_text(lo, hi), ")"));
    }
    resolved_[key] = x;
    return x;
}

double Section::number(const std::string& key) {
    const KeySpec& k = spec(key, KeyType::number);
    return number_in(key, k.def ? std::optional<double>(std::stod(k.def)) : std::nullopt);
}

double Section::number(const std::string& key, double def) {
    spec(key, KeyType::number);
    return number_in(key, def);
}

double Section::number_in(const std::string& key, std::optional<double> def) {
    const KeySpec& k = key_spec(key_path(key));
    const double lo = k.lo, hi = k.hi;
    const YAML::Node* v = find(key);
    double x = 0;
    if (!v) {
        if (!def)
            fail(key, cat("required key is missing (a number in [", lo, ", ", hi, "])"));
        x = *def;
    } else {
        const std::string& s = scalar(key, "a number").Scalar();
        std::istringstream in(s);
        if (!(in >> x) || !in.eof() || !std::isfinite(x))
            fail(key,
                 cat("'",
                     s,
                     "' is not a number in [",
                     format_number(lo),
                     ", ",
                     format_number(hi),
                     "]"));
        if (x < lo || x > hi)
            fail(key,
                 cat(s,
                     " is out of range (allowed: ",
                     format_number(lo),
                     " to ",
                     format_number(hi),
                     ")"));
    }
    resolved_[key] = format_number(x);
    return x;
}

int64_t Section::integer_or_auto(const std::string& key) {
    spec(key, KeyType::integer_or_auto);
    auto it = values_.find(key);
    if (it == values_.end() || (it->second.IsScalar() && it->second.Scalar() == "auto")) {
        find(key);
        resolved_[key] = "auto";
        return 0;
    }
    return integer_in(key, std::nullopt);
}

bool Section::flag(const std::string& key) {
    const KeySpec& k = spec(key, KeyType::flag);
    const YAML::Node* v = find(key);
    bool x = std::string(k.def) == "true";
    if (v) {
        const std::string& s = scalar(key, "true or false").Scalar();
        if (s == "true")
            x = true;
        else if (s == "false")
            x = false;
        else
            fail(key, cat("'", s, "' is not a boolean (allowed: true, false)"));
    }
    resolved_[key] = x;
    return x;
}

std::string Section::choice(const std::string& key) {
    const KeySpec& k = spec(key, KeyType::choice);
    return choice_in(key, k.choices, k.def ? std::optional<std::string>(k.def) : std::nullopt);
}

std::string Section::choice(const std::string& key, const std::string& def) {
    const KeySpec& k = spec(key, KeyType::choice);
    return choice_in(key, k.choices, def);
}

std::string Section::choice_in(const std::string& key,
                               const std::vector<std::string>& allowed,
                               std::optional<std::string> def) {
    const YAML::Node* v = find(key);
    std::string x;
    if (!v) {
        if (!def)
            fail(key, cat("required key is missing (allowed: ", join(allowed), ")"));
        x = *def;
    } else {
        x = scalar(key, "a word").Scalar();
        if (std::find(allowed.begin(), allowed.end(), x) == allowed.end())
            fail(key, cat("'", x, "' is not allowed (allowed: ", join(allowed), ")"));
    }
    resolved_[key] = x;
    return x;
}

std::string Section::text(const std::string& key) {
    const KeySpec& k = spec(key, KeyType::text);
    return text_in(key, k.def ? std::optional<std::string>(k.def) : std::nullopt);
}

std::string Section::text(const std::string& key, const std::string& def) {
    spec(key, KeyType::text);
    return text_in(key, def);
}

std::string Section::text_in(const std::string& key, std::optional<std::string> def) {
    const YAML::Node* v = find(key);
    std::string x;
    if (!v) {
        if (!def)
            fail(key, "required key is missing (a string)");
        x = *def;
    } else {
        x = scalar(key, "a string").Scalar();
        if (x.empty())
            fail(key, "must not be empty");
    }
    resolved_[key] = x;
    return x;
}

namespace {

// Empty when p is acceptable, else what is wrong with it.
std::string check_path(const fs::path& p, KeyType kind) {
    std::error_code ec;
    fs::file_status st = fs::status(p, ec);
    if (ec || !fs::exists(st))
        return cat("'", p.string(), "' does not exist");
    bool is_dir = fs::is_directory(st);
    if (kind == KeyType::file && is_dir)
        return cat("'", p.string(), "' is a folder, expected a file");
    if ((kind == KeyType::dir || kind == KeyType::path_map) && !is_dir)
        return cat("'", p.string(), "' is not a folder");
    if (!is_dir) {
        std::FILE* f = std::fopen(p.c_str(), "rb");
        if (!f)
            return cat("'", p.string(), "' cannot be read");
        std::fclose(f);
    }
    return {};
}

std::string resolve(const std::string& dir, const std::string& p) {
    fs::path path(p);
    if (path.is_relative())
        path = fs::path(dir) / path;
    return path.lexically_normal().string();
}

}  // namespace

std::string Section::path(const std::string& key) {
    const KeySpec& k = key_spec(key_path(key));
    HYMOE_CHECK(k.type == KeyType::file || k.type == KeyType::dir || k.type == KeyType::file_or_dir,
                "deck key ",
                k.path,
                " is read as a path");
    const YAML::Node* v = find(key);
    if (!v) {
        if (!k.def)
            fail(key, "required key is missing (a path, relative to the deck's folder)");
        return {};
    }
    std::string raw = scalar(key, "a path").Scalar();
    if (raw.empty())
        fail(key, "must not be empty");
    std::string p = resolve(ctx_.dir, raw);
    std::string bad = check_path(p, k.type);
    if (!bad.empty())
        fail(key, bad);
    resolved_[key] = raw;  // as written: the resolved deck stays valid from the deck's folder
    return p;
}

std::vector<std::string> Section::list(const std::string& key) {
    const std::vector<std::string>& allowed = spec(key, KeyType::list).choices;
    const YAML::Node* v = find(key);
    std::vector<std::string> out;
    if (v) {
        if (!v->IsSequence())
            fail(key,
                 cat("expected a list, got ",
                     type_name(*v),
                     " (allowed items: ",
                     join(allowed),
                     ")"));
        for (const auto& item : *v) {
            const bool ok =
                item.IsScalar() &&
                (allowed.empty()
                     ? !item.Scalar().empty()
                     : std::find(allowed.begin(), allowed.end(), item.Scalar()) != allowed.end());
            if (!ok)
                ctx_.fail(item.Mark(),
                          key_path(key),
                          cat("'",
                              item.IsScalar() ? item.Scalar() : type_name(item),
                              "' is not allowed (allowed: ",
                              join(allowed),
                              ")"));
            out.push_back(item.Scalar());
        }
    }
    YAML::Node seq(YAML::NodeType::Sequence);
    for (const auto& s : out)
        seq.push_back(s);
    resolved_[key] = seq;
    return out;
}

std::map<std::string, std::string> Section::path_map(const std::string& key) {
    const KeyType kind = spec(key, KeyType::path_map).type;
    const YAML::Node* v = find(key);
    std::map<std::string, std::string> out;
    YAML::Node resolved(YAML::NodeType::Map);
    if (v) {
        if (!v->IsMap())
            fail(key, cat("expected a map of name: path, got ", type_name(*v)));
        for (auto it = v->begin(); it != v->end(); ++it) {
            std::string name = it->first.Scalar();
            std::string item_path = key_path(key) + "." + name;
            if (!it->second.IsScalar())
                ctx_.fail(it->second.Mark(), item_path, "expected a path");
            if (out.count(name))
                ctx_.fail(it->first.Mark(), item_path, "duplicate key");
            std::string p = resolve(ctx_.dir, it->second.Scalar());
            std::string bad = check_path(p, kind);
            if (!bad.empty())
                ctx_.fail(it->second.Mark(), item_path, bad);
            out[name] = p;
            resolved[name] = it->second.Scalar();
        }
    }
    resolved_[key] = resolved;
    return out;
}

Section Section::section(const std::string& key) {
    spec(key, KeyType::section);
    const YAML::Node* v = find(key);
    resolved_[key] = YAML::Node(YAML::NodeType::Map);
    YAML::Node child = resolved_[key];
    return Section(ctx_, v ? *v : YAML::Node(), child, key_path(key), mark_of(key));
}

void Section::finish() const {
    if (!node_.IsMap())
        return;
    for (auto it = node_.begin(); it != node_.end(); ++it)  // file order: the first unknown key
        if (!read_.count(it->first.Scalar()))
            ctx_.fail(it->first.Mark(),
                      key_path(it->first.Scalar()),
                      cat("unknown key (allowed: ", join(section_keys(path_)), ")"));
}

}  // namespace hymoe::deck
