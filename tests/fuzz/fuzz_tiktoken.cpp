// Fuzz target: a tiktoken rank file ("<base64 token> <rank>" lines; text/tokenizer.h) -> a
// Tokenizer or one hymoe::Error; one that loads encodes and decodes a fixed text.
#include "fuzz.h"
#include "hymoe/text/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string path = hymoe::fuzz::write_file("ranks.tiktoken", data, size);
    return hymoe::fuzz::guarded([&] {
        const hymoe::text::Tokenizer tok = hymoe::text::load_tiktoken(path, "cl100k_base");
        tok.decode(tok.encode("hello world 123 <|endoftext|> \xE2\x82\xAC\xFF"));
    });
}
