// HF safetensors: one file (SafetensorsFile), a checkpoint folder (SafetensorsFolder: an index
// model.safetensors.index.json naming the shard of every tensor, or a single model.safetensors),
// and a writer (write_safetensors).
//
// File layout: u64 little-endian header length N | N bytes of JSON | data. The JSON is an object
// {name: {"dtype": "BF16", "shape": [d0, ...], "data_offsets": [begin, end]}, ...} with an optional
// "__metadata__": {str: str}; offsets are relative to the data start (byte 8 + N).
//
// Invariants once a SafetensorsFile is constructed (the header is validated completely at open,
// every failure is one hymoe::Error with Exit::bad_input naming the file and, where relevant, the
// tensor): every tensor has a known dtype, non-negative shape, offsets inside the data section,
// end - begin == numel * dtype size, no two tensors share a byte, no name appears twice. Reads then
// copy straight out of a read-only private memory map, touching only the bytes they need (read_rows
// and read_slice are how a rank takes its TP/EP slice of a full tensor). A file's reads may run on
// several threads at once; a folder's may not (it opens shards lazily).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "hymoe/core/types.h"
#include "hymoe/tensor/tensor.h"

namespace hymoe::io {

// Element types a safetensors header may name ("BOOL", "U8", ..., "F64").
enum class StDType {
    boolean,
    u8,
    i8,
    f8_e4m3,
    f8_e5m2,
    f8_e8m0,
    i16,
    u16,
    f16,
    bf16,
    i32,
    u32,
    f32,
    i64,
    u64,
    f64,
};

const char* to_string(StDType t);  // the header spelling: "BF16"
size_t st_dtype_size(StDType t);
std::optional<StDType> st_dtype_from_string(const std::string& s);
StDType st_dtype_of(DType t);  // how a hymoe dtype is stored: f32 -> F32, u8 -> U8, ...

// FP8 block-scaled matrices (DeepSeek-V3/V3.2, HF quantization_config {"quant_method": "fp8",
// "fmt": "e4m3", "weight_block_size": [rows, cols]}): a 2-D weight W [out, in] is stored as F8_E4M3
// codes q with a sibling "<name>_scale_inv" of float scales s [ceil(out/rows), ceil(in/cols)]; the
// weight is W[i][j] = e4m3(q[i][j]) · s[i/rows][j/cols] (the product in fp32, as DeepSeek's
// weight_dequant), then converted into the destination's dtype like any F32 value.
struct Fp8Blocks {
    int64_t rows = 128, cols = 128;
};

// The value of one e4m3 code (OCP FP8 E4M3, "fn": bias 7, no infinities, S.1111.111 is NaN, the
// largest finite value is 448); exact in fp32.
float e4m3_to_float(uint8_t code);

// One tensor as the header describes it.
struct SafetensorsInfo {
    StDType dtype = StDType::f32;
    Shape shape;         // [d0, d1, ...], row-major
    uint64_t begin = 0;  // offset of the first byte, relative to the data start
    uint64_t bytes = 0;  // numel * st_dtype_size(dtype)
};

// One .safetensors file, memory-mapped read-only (MAP_PRIVATE) for its lifetime. Movable.
//
// Reads convert element types: F32/F16/BF16/F64/I32/I64 into an f32, f16 or bf16 destination
// (through f32, rounding to nearest even), and any type into the same type (I32 -> i32, I64 -> i64,
// U8/BOOL -> u8). The destination is a CPU tensor whose shape is checked against the stored one.
class SafetensorsFile {
public:
    explicit SafetensorsFile(const std::string& path);

    const std::string& path() const { return path_; }
    const std::vector<std::string>& names() const { return names_; }  // sorted
    const std::map<std::string, std::string>& metadata() const { return metadata_; }
    bool has(const std::string& name) const { return tensors_.count(name) != 0; }
    const SafetensorsInfo& info(const std::string& name) const;  // missing: Exit::bad_input
    // The stored bytes of one tensor (info(name).bytes of them), valid while this file lives.
    const void* raw(const std::string& name) const;

    // The whole tensor; dest.shape must equal the stored shape.
    void read(const std::string& name, Tensor& dest) const;
    // Rows [row_begin, row_begin + dest.shape[0]) along dim 0; every other dim whole.
    void read_rows(const std::string& name, int64_t row_begin, Tensor& dest) const;
    // [begin, begin + dest.shape[dim]) along `dim` (negative counts from the end), every other dim
    // whole: a column slice of a [n_out, n_in] weight is read_slice(name, 1, col0, dest).
    void read_slice(const std::string& name, int dim, int64_t begin, Tensor& dest) const;
    // read_slice of a 2-D F8_E4M3 weight, dequantized with its block scales `scale` (f32
    // [ceil(out/rows), ceil(in/cols)] of the whole tensor, already checked by the caller).
    void read_slice_fp8(const std::string& name,
                        int dim,
                        int64_t begin,
                        const Tensor& scale,
                        const Fp8Blocks& blocks,
                        Tensor& dest) const;

private:
    struct Unmap {
        size_t size;  // bytes mapped (no initializer: the deleter must be default-constructible)
        void operator()(void* p) const;
    };
    void parse_header(const char* text, size_t len);
    // The dim (made non-negative) of a read_slice whose destination fits the stored tensor.
    int check_slice(const std::string& name, int dim, int64_t begin, const Tensor& dest) const;

    std::string path_;
    std::unique_ptr<void, Unmap> map_;     // the whole file
    const unsigned char* data_ = nullptr;  // data section: map_ + 8 + header length
    uint64_t data_size_ = 0;
    std::map<std::string, SafetensorsInfo> tensors_;
    std::vector<std::string> names_;
    std::map<std::string, std::string> metadata_;
};

// A checkpoint folder: model.safetensors.index.json ({"weight_map": {tensor: shard file}}) with its
// shards, or a single model.safetensors (`dir` may also be the path of one .safetensors file).
// Shards are opened (and their headers validated) on first use. Unknown names, a shard that is
// missing or does not hold a tensor the index assigns to it, and a bad index: Exit::bad_input.
class SafetensorsFolder {
public:
    explicit SafetensorsFolder(const std::string& dir);

    const std::string& dir() const { return dir_; }
    const std::vector<std::string>& names() const { return names_; }  // sorted
    bool has(const std::string& name) const { return shard_of_.count(name) != 0; }
    const SafetensorsInfo& info(const std::string& name) const;
    // The shard holding `name`, opened if it was not yet.
    const SafetensorsFile& file_of(const std::string& name) const;

    void read(const std::string& name, Tensor& dest) const;
    void read_rows(const std::string& name, int64_t row_begin, Tensor& dest) const;
    void read_slice(const std::string& name, int dim, int64_t begin, Tensor& dest) const;

    // FP8 weights are block-scaled by `blocks`, as `config` (the config.json, for messages) says.
    void set_fp8(const Fp8Blocks& blocks, const std::string& config);

    // Open every shard and check that each holds the tensors the index assigns to it (the whole
    // checkpoint's headers, none of its data): a full check up front instead of lazily.
    void check_all() const;

private:
    // A read of an FP8 weight (or of a weight with block scales): checked and dequantized into
    // dest (whole: the whole tensor, as read); false when `name` is neither, for the plain read.
    bool read_fp8(const std::string& name, bool whole, int dim, int64_t begin, Tensor& dest) const;

    std::string dir_;                              // as given
    std::string base_;                             // the folder shard file names are relative to
    std::string index_;                            // path of the index, "" for a single file
    std::map<std::string, std::string> shard_of_;  // tensor -> shard file name
    std::vector<std::string> names_;
    mutable std::map<std::string, std::unique_ptr<SafetensorsFile>> shards_;  // file name -> open
    std::optional<Fp8Blocks> fp8_;  // set_fp8: FP8 weights are dequantized
    std::string fp8_config_;        // the config.json that says so
};

// Write a valid safetensors file at `path`: f32/f16/bf16 tensors are stored as `store` (converted,
// rounding to nearest even), integer tensors as their own type. Header keys come "__metadata__"
// first then tensors by name; data is laid out by element size (largest first) then name, so every
// tensor is aligned to its element size; the header is padded with spaces to a multiple of 8, as HF
// does. The file is written as path + ".partial" and renamed over `path` when complete.
void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {},
                       DType store = DType::bf16);

}  // namespace hymoe::io
