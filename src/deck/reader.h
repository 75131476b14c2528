// Typed, checked reads from one YAML map of the deck. Each read takes the key's type, default and
// range from the schema table (schema.h), records where the value came from and writes the
// resolved value (default filled in) into the resolved tree. A key the table does not list is an
// error when the section is opened; finish() rejects any listed key the job did not read.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "hymoe/deck/deck.h"
#include "schema.h"

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

class Section {
public:
    // Rejects at once, at its line, any key the schema table does not list for this section.
    Section(
        ParseContext& ctx, YAML::Node node, YAML::Node resolved, std::string path, YAML::Mark mark);

    bool has(const std::string& key) const;
    // Readers: type, default and range come from the schema table (schema.h); a key whose
    // table default is nullptr is required. The overloads with def pass a default that depends
    // on other keys (the table says so in words).
    int64_t integer(const std::string& key);
    double number(const std::string& key);
    double number(const std::string& key, double def);
    // An integer in range or the word "auto" (the default), returned as 0.
    int64_t integer_or_auto(const std::string& key);
    bool flag(const std::string& key);
    std::string choice(const std::string& key);
    std::string choice(const std::string& key, const std::string& def);
    std::string text(const std::string& key);
    std::string text(const std::string& key, const std::string& def);
    // A path relative to the deck folder, checked to exist as the table's file, dir or
    // file_or_dir; "" when absent and not required.
    std::string path(const std::string& key);
    std::vector<std::string> list(const std::string& key);
    // A map of name -> folder (each checked like path()).
    std::map<std::string, std::string> path_map(const std::string& key);
    // A nested map; an absent one reads as empty (every key takes its default).
    Section section(const std::string& key);
    // An optional key this job does not use: accepted by finish(), absent from the resolved deck.
    void allow(const std::string& key) { read_.insert(key); }
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
    const KeySpec& spec(const std::string& key, KeyType type) const;  // the table's, checked
    int64_t integer_in(const std::string& key, std::optional<int64_t> def);
    double number_in(const std::string& key, std::optional<double> def);
    std::string text_in(const std::string& key, std::optional<std::string> def);
    std::string choice_in(const std::string& key,
                          const std::vector<std::string>& allowed,
                          std::optional<std::string> def);

    ParseContext& ctx_;
    YAML::Node node_;      // the map read (undefined or null when absent)
    YAML::Node resolved_;  // this section in the resolved tree
    std::string path_;     // "finetune.lora"
    YAML::Mark mark_;      // where the section starts (or its parent, when absent)
    std::map<std::string, YAML::Node> values_;  // key -> value node
    std::map<std::string, YAML::Mark> key_marks_;
    std::set<std::string> read_;
};

}  // namespace hymoe::deck
