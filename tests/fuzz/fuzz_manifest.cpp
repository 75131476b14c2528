// Fuzz target: a checkpoint's manifest.json (io/checkpoint.h's TensorStore) -> an index of
// tensors or one hymoe::Error; every tensor it lists is then looked up and read (the files it
// names do not exist: a clean Exit::checkpoint error).
#include "fuzz.h"
#include "hymoe/io/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string text(reinterpret_cast<const char*>(data), size);
    return hymoe::fuzz::guarded([&] {
        hymoe::io::TensorStore store(hymoe::fuzz::scratch_dir(), text);
        for (const char* name : {"w", "model.embed_tokens.weight", "x"})
            if (store.has(name)) {
                const hymoe::Shape s = store.shape(name);
                store.dtype(name);
                if (s.size() == 2 && s[0] > 0 && s[1] > 0 && s[0] * s[1] < 4096) {
                    hymoe::Buffer t(hymoe::DType::f32, s);
                    store.read(name, -1, 0, 0, t.view());
                }
            }
    });
}
