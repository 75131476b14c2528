// Typed, checked reads from one YAML map of the deck. Each read records where the value came from
// and writes the resolved value (default filled in) into the resolved tree, so the schema is
// written once, in parse.cpp. finish() rejects any key the section did not read.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "hymoe/deck/deck.h"

namespace hymoe::deck {

struct ParseContext {
    std::string file;                              // the deck path, as given
    std::string dir;                               // relative paths resolve against it
    std::map<std::string, std::string> overrides;  // key path -> "--set key.path=value"
    std::map<std::string, Source>* sources = nullptr;

    // The one error line: "<file>:L:C: key.path: what" or "--set k=v: key.path: what".
    [[noreturn]] void fail(const YAML::Mark& mark,
                           const std::string& path,
                           const std::string& what) const;
    std::string where(const YAML::Mark& mark, const std::string& path) const;
};

enum class PathKind { file, dir, file_or_dir };

class Section {
public:
    Section(
        ParseContext& ctx, YAML::Node node, YAML::Node resolved, std::string path, YAML::Mark mark);

    bool has(const std::string& key) const;
    // Readers: std::nullopt as default means the key is required.
    int64_t integer(const std::string& key, std::optional<int64_t> def, int64_t lo, int64_t hi);
    double number(const std::string& key, std::optional<double> def, double lo, double hi);
    // An integer in [lo, hi] or the word "auto" (the default), returned as 0.
    int64_t integer_or_auto(const std::string& key, int64_t lo, int64_t hi);
    bool flag(const std::string& key, bool def);
    std::string choice(const std::string& key,
                       std::optional<std::string> def,
                       const std::vector<std::string>& allowed);
    std::string text(const std::string& key, std::optional<std::string> def);
    // A path relative to the deck folder; checked to exist as `kind` when must_exist.
    std::string path(const std::string& key, bool required, PathKind kind, bool must_exist);
    std::vector<std::string> list(const std::string& key, const std::vector<std::string>& allowed);
    // A map of name -> path (each path checked like path()).
    std::map<std::string, std::string> path_map(const std::string& key, PathKind kind);
    // A nested map; an absent one reads as empty (every key takes its default).
    Section section(const std::string& key);
    // An optional key this job does not use: accepted by finish(), absent from the resolved deck.
    void allow(const std::string& key) { allowed_.push_back(key); }
    // Unknown keys are errors naming the allowed ones.
    void finish() const;

    [[noreturn]] void fail(const std::string& key, const std::string& what) const;
    const std::string& path_name() const { return path_; }

private:
    const YAML::Node* find(const std::string& key);  // marks the key as read
    std::string key_path(const std::string& key) const;
    YAML::Mark mark_of(const std::string& key) const;
    void record(const std::string& key);
    const YAML::Node& scalar(const std::string& key, const char* expected);

    ParseContext& ctx_;
    YAML::Node node_;      // the map read (undefined or null when absent)
    YAML::Node resolved_;  // this section in the resolved tree
    std::string path_;     // "finetune.lora"
    YAML::Mark mark_;      // where the section starts (or its parent, when absent)
    std::map<std::string, YAML::Node> values_;  // key -> value node
    std::map<std::string, YAML::Mark> key_marks_;
    std::set<std::string> read_;
    std::vector<std::string> allowed_;  // keys asked for, in order, for the unknown-key message
};

}  // namespace hymoe::deck
