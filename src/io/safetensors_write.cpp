// Atomic safetensors writer (write_safetensors): float tensors converted to one store dtype, data
// laid out largest element first so each tensor is aligned, header padded to 8 bytes as HF does;
// written to <path>.partial, fsynced, then renamed over path.
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "hymoe/core/error.h"
#include "hymoe/io/safetensors.h"
#include "safetensors_detail.h"

namespace hymoe::io {

namespace fs = std::filesystem;
using detail::convert;
using detail::is_float_dtype;

void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata,
                       DType store) {
    HYMOE_CHECK(is_float_dtype(store), "safetensors store dtype ", to_string(store));
    struct Item {
        const std::string* name;
        const Tensor* t;
        StDType dtype;   // as stored
        uint64_t begin;  // relative to the data start
        uint64_t bytes;
    };
    std::vector<Item> items;
    std::set<std::string> seen;
    for (const auto& [name, t] : tensors) {
        HYMOE_CHECK(seen.insert(name).second && name != "__metadata__",
                    "tensor name '",
                    name,
                    "' is reserved or given twice");
        HYMOE_CHECK(t.device == Device::cpu && (t.data || t.numel() == 0),
                    "tensor '",
                    name,
                    "' is not in host memory");
        for (int64_t d : t.shape)
            HYMOE_CHECK(d >= 0, "tensor '", name, "' has shape ", shape_string(t.shape));
        StDType st = st_dtype_of(is_float_dtype(t.dtype) ? store : t.dtype);
        items.push_back({&name, &t, st, 0, static_cast<uint64_t>(t.numel()) * st_dtype_size(st)});
    }
    // Data layout: largest element first, then by name, so each tensor is aligned to its element.
    std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
        size_t sa = st_dtype_size(a.dtype), sb = st_dtype_size(b.dtype);
        return sa != sb ? sa > sb : *a.name < *b.name;
    });
    uint64_t offset = 0;
    for (Item& it : items) {
        it.begin = offset;
        offset += it.bytes;
    }
    std::vector<const Item*> by_name;
    for (const Item& it : items)
        by_name.push_back(&it);
    std::sort(by_name.begin(), by_name.end(), [](const Item* a, const Item* b) {
        return *a->name < *b->name;
    });

    nlohmann::ordered_json header = nlohmann::ordered_json::object();
    if (!metadata.empty())
        header["__metadata__"] = metadata;
    for (const Item* it : by_name) {
        nlohmann::ordered_json e;
        e["dtype"] = to_string(it->dtype);
        e["shape"] = it->t->shape;
        e["data_offsets"] = {it->begin, it->begin + it->bytes};
        header[*it->name] = std::move(e);
    }
    std::string text = header.dump();
    text.append((8 - text.size() % 8) % 8, ' ');  // HF pads so the data starts 8-byte aligned

    const std::string partial = path + ".partial";
    std::FILE* f = std::fopen(partial.c_str(), "wb");
    if (!f)
        HYMOE_FAIL_ONE(Exit::internal, "cannot create ", partial, ": ", std::strerror(errno));
    uint64_t len = text.size();
    bool ok = std::fwrite(&len, 8, 1, f) == 1 && std::fwrite(text.data(), 1, len, f) == len;
    std::vector<unsigned char> chunk;
    for (const Item& it : items) {
        const Tensor& t = *it.t;
        const unsigned char* src = static_cast<const unsigned char*>(t.data);
        if (!ok || it.bytes == 0)
            continue;
        if (st_dtype_of(t.dtype) == it.dtype) {
            ok = std::fwrite(src, 1, it.bytes, f) == it.bytes;
            continue;
        }
        const size_t per_chunk = size_t{1} << 16;  // elements converted at a time
        chunk.resize(per_chunk * st_dtype_size(it.dtype));
        for (size_t i = 0, n = static_cast<size_t>(t.numel()); ok && i < n; i += per_chunk) {
            size_t m = std::min(per_chunk, n - i);
            convert(src + i * dtype_size(t.dtype), st_dtype_of(t.dtype), chunk.data(), store, m);
            ok = std::fwrite(chunk.data(), st_dtype_size(it.dtype), m, f) == m;
        }
    }
    ok = std::fflush(f) == 0 && ok;
    ok = ::fsync(::fileno(f)) == 0 && ok;
    ok = std::fclose(f) == 0 && ok;
    if (!ok) {
        std::string why = std::strerror(errno);
        std::remove(partial.c_str());
        HYMOE_FAIL_ONE(Exit::internal, "writing ", partial, " failed: ", why);
    }
    std::error_code ec;
    fs::rename(partial, path, ec);
    if (ec)
        HYMOE_FAIL_ONE(Exit::internal, "renaming ", partial, " to ", path, ": ", ec.message());
}

}  // namespace hymoe::io
