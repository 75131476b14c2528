// Fuzz target: deck text (YAML) -> a validated Deck or one hymoe::Error (deck/deck.h).
// The deck sits in a scratch folder so the paths it names resolve there (and mostly do not
// exist: the validator's "no such file" errors are part of what is fuzzed).
#include <string>

#include "fuzz.h"
#include "hymoe/deck/deck.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string text(reinterpret_cast<const char*>(data), size);
    const std::string path = hymoe::fuzz::scratch_dir() + "/deck.yaml";
    return hymoe::fuzz::guarded([&] { hymoe::deck::parse_deck(text, path, {}); });
}
