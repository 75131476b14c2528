// The deck schema as data: every section and key with its type, default, range and meaning, in
// one table (schema.cpp). The readers (reader.cpp) take type, default and range from it, a
// section rejects any key the table does not list, and --describe-deck (describe.cpp) prints it,
// so docs/reference/deck.md, generated from that output, cannot drift from the validator.
// Adding a key: one line in the table, one read in parse.cpp.
#pragma once

#include <string>
#include <vector>

namespace hymoe::deck {

enum class KeyType {
    section,          // a nested map of keys
    integer,          // a decimal integer in [lo, hi]
    integer_or_auto,  // an integer in [lo, hi] or the word auto
    number,           // a finite number in [lo, hi]
    flag,             // true or false
    choice,           // one word of choices
    text,             // a non-empty string
    file,             // a path to an existing file, relative to the deck's folder
    dir,              // a path to an existing folder
    file_or_dir,      // a path to an existing file or folder
    list,             // a list of words, each one of choices (no choices: any non-empty words)
    path_map,         // a map of name -> existing folder
};

struct KeySpec {
    const char* path;  // "inference.batch.max_tokens"
    KeyType type;
    // The default as a deck would write it; nullptr = required. A default that depends on
    // other keys is written in words (then the reader passes the value) and a key with no
    // default value is "".
    const char* def;
    double lo, hi;                     // integer, integer_or_auto, number
    std::vector<std::string> choices;  // choice, list
    const char* help;
};

// Every section and key, in the order the parser reads them (the unknown-key message lists a
// section's keys in this order).
const std::vector<KeySpec>& deck_schema();
// The spec of a key path; an internal error when the table has none (a read the table misses).
const KeySpec& key_spec(const std::string& path);
// The keys directly inside a section ("" = the top level), in table order.
std::vector<std::string> section_keys(const std::string& section);
const char* type_name(KeyType t);

}  // namespace hymoe::deck
