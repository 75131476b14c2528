// Fuzz target: the PNG and JPEG decoders and the patch preprocessing (io/image.h). The input is
// written as x.png and as x.jpg, each decoded and (when it decodes) preprocessed; the pixel
// limit (64k pixels: a legal 1M-pixel image takes over a second to resize under ASan) keeps a
// run under the 1 s hang limit; larger headers exercise the oversized-image check.
#include "fuzz.h"
#include "hymoe/io/image.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    hymoe::io::ImageOptions o;
    o.max_pixels = 1 << 16, o.max_patches = 256;
    for (const char* name : {"x.png", "x.jpg"}) {
        const std::string path = hymoe::fuzz::write_file(name, data, size);
        hymoe::fuzz::guarded([&] {
            const hymoe::io::RawImage raw = hymoe::io::decode_image(path, o.max_pixels);
            hymoe::io::preprocess_image(raw, o);
        });
    }
    return 0;
}
