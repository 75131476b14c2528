// Fuzz target: encode and decode of arbitrary bytes with a fixed byte-level tokenizer (the
// cl100k_base pattern over 256 byte tokens and a few merges, the Kimi chunking rules, special
// tokens). Properties: encode never fails; decode(encode(x)) == x for every x (byte-level BPE is
// lossless, special tokens included); the streaming Detokenizer gives the same bytes as decode
// for valid UTF-8; decoding arbitrary ids < n_vocab never fails.
#include <cstring>

#include "fuzz.h"
#include "hymoe/text/tokenizer.h"
#include "hymoe/text/utf8.h"

namespace {

using hymoe::text::Tokenizer;

Tokenizer make_tokenizer() {
    Tokenizer tok;
    for (int b = 0; b < 256; ++b)
        tok.add_token(std::string(1, static_cast<char>(b)), b);
    const char* merges[] = {"he", "ll", "hell", "hello", " w", " wo", "12", "123", "\xE2\x82"};
    int32_t id = 256;
    for (const char* m : merges)
        tok.add_token(m, id++);
    tok.add_pretokenizer(hymoe::text::tiktoken_preset_pattern("cl100k_base"));
    tok.add_special({"<|endoftext|>", id++});
    tok.add_special({"<|im_end|>", id++});
    tok.set_chunking(64, 16);
    tok.finish();
    return tok;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static const Tokenizer tok = make_tokenizer();
    const std::string text(reinterpret_cast<const char*>(data), size);
    return hymoe::fuzz::guarded([&] {
        const std::vector<int32_t> ids = tok.encode(text);
        if (tok.decode(ids) != text) {
            std::fprintf(stderr, "fuzz: decode(encode(x)) != x\n");
            std::abort();
        }
        if (hymoe::text::utf8_first_invalid(text) == std::string::npos) {
            hymoe::text::Detokenizer d(tok);
            std::string streamed;
            for (int32_t i : ids)
                streamed += d.push(i);
            if (streamed + d.finish() != text) {
                std::fprintf(stderr, "fuzz: the streamed text differs from decode\n");
                std::abort();
            }
        }
        std::vector<int32_t> raw(size / 2);
        for (size_t i = 0; i < raw.size(); ++i)
            raw[i] = (data[2 * i] | data[2 * i + 1] << 8) % tok.n_vocab();
        tok.decode(raw);
    });
}
