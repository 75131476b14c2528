// Fuzz target: a safetensors file (8-byte header length, JSON header, data) and its folder
// index (io/safetensors.h). The first input byte picks which: even -> the input is
// model.safetensors, read whole; odd -> the rest is model.safetensors.index.json beside a small
// valid shard, and every tensor the index names is read through the folder.
#include <filesystem>

#include "fuzz.h"
#include "hymoe/io/safetensors.h"

namespace {

using namespace hymoe;

void read_all(const io::SafetensorsFile& f) {
    for (const std::string& name : f.names()) {
        const io::SafetensorsInfo& info = f.info(name);
        if (info.bytes > (1u << 20))
            continue;  // reading is checked against the header; keep each run small
        Buffer t(DType::f32, info.shape);
        f.read(name, t.view());
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size == 0)
        return 0;
    const std::string dir = fuzz::scratch_dir() + ((data[0] & 1) ? "/folder" : "/file");
    std::filesystem::create_directories(dir);
    if ((data[0] & 1) == 0) {
        const std::string path = fuzz::write_file("file/model.safetensors", data + 1, size - 1);
        return fuzz::guarded([&] { read_all(io::SafetensorsFile(path)); });
    }
    static const bool shard = [&] {  // one tensor "w" [2, 3] f32 in shard-1.safetensors
        Buffer w(DType::f32, {2, 3});
        for (int i = 0; i < 6; ++i)
            w.ptr<float>()[i] = static_cast<float>(i);
        io::write_safetensors(dir + "/shard-1.safetensors", {{"w", w.view()}}, {}, DType::f32);
        return true;
    }();
    (void)shard;
    fuzz::write_file("folder/model.safetensors.index.json", data + 1, size - 1);
    return fuzz::guarded([&] {
        io::SafetensorsFolder folder(dir);
        for (const std::string& name : folder.names()) {
            const io::SafetensorsInfo& info = folder.info(name);
            if (info.bytes > (1u << 20))
                continue;
            Buffer t(DType::f32, info.shape);
            folder.read(name, t.view());
        }
    });
}
