// Private to src/io/safetensors*.cpp: the helpers the reader, the folder and the writer share.
// parse_strict: JSON parsing that records the first duplicate key (nlohmann keeps the last value
// silently); convertible/convert: element conversion between a stored type and a tensor dtype.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "hymoe/io/safetensors.h"

namespace hymoe::io::detail {

// ---- strict JSON --------------------------------------------------------------------------------

// The first key that appears twice in one object, and the top-level key it sits under.
struct DuplicateKey {
    std::string key;
    std::string top;  // the enclosing top-level key ("" when the duplicate is itself top-level)
};

// Parse `text` like json::parse (throwing json::parse_error), recording the first duplicate key in
// *dup: nlohmann keeps the last value of a duplicated key silently.
nlohmann::json parse_strict(std::string_view text, std::optional<DuplicateKey>& dup);

// nlohmann's message without its "[json.exception.parse_error.101] " prefix.
std::string json_message(const nlohmann::json::exception& e);

// ---- element conversion -------------------------------------------------------------------------

// f32, f16 or bf16.
bool is_float_dtype(DType t);

// Stored type -> destination type: the same type (BOOL into u8), or a number into a float type.
bool convertible(StDType s, DType d);

// n elements of stored type s at src -> n elements of type d at dst (convertible(s, d) holds).
void convert(const unsigned char* src, StDType s, unsigned char* dst, DType d, size_t n);

}  // namespace hymoe::io::detail
