// safetensors in a scratch folder: round trips of F32/BF16/F16 (exact after rounding to the stored
// type), row and column slices against the whole tensor, a sharded folder with an index, and one
// test per malformed input, each asserting Exit::bad_input and a message that names the file and,
// where there is one, the tensor. Malformed files are written byte by byte (raw_file) so that each
// breaks exactly one rule.
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <unistd.h>
#include <utility>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "hymoe/core/error.h"
#include "hymoe/io/safetensors.h"

namespace fs = std::filesystem;
using hymoe::Buffer;
using hymoe::DType;
using hymoe::Tensor;
using hymoe::io::SafetensorsFile;
using hymoe::io::SafetensorsFolder;
using hymoe::io::StDType;
using hymoe::io::write_safetensors;

namespace {

// A scratch folder, removed with everything in it.
struct Scratch {
    fs::path dir;
    Scratch() {
        static int n = 0;
        dir = fs::temp_directory_path() /
              ("hymoe_st_test_" + std::to_string(::getpid()) + "_" + std::to_string(n++));
        fs::create_directories(dir);
    }
    ~Scratch() { fs::remove_all(dir); }
    std::string path(const std::string& name) const { return (dir / name).string(); }
};

// A float tensor [shape] holding values that do not round trip through bf16/f16 unchanged.
Buffer ramp(const hymoe::Shape& shape, float scale = 0.37f) {
    Buffer b(DType::f32, shape);
    float* p = b.ptr<float>();
    for (int64_t i = 0; i < b.view().numel(); ++i)
        p[i] = scale * static_cast<float>(i) - 1.3f + 1e-3f * static_cast<float>(i % 7);
    return b;
}

std::vector<float> floats(const Tensor& t) {
    const float* p = t.ptr<float>();
    return std::vector<float>(p, p + t.numel());
}

// A file of the 8-byte little-endian header length, the header text and `data` bytes of zeros;
// header_len overrides the length written (to make it lie).
void raw_file(const std::string& path,
              const std::string& header,
              size_t data,
              int64_t header_len = -1) {
    uint64_t len = header_len < 0 ? header.size() : static_cast<uint64_t>(header_len);
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(&len), 8);
    out << header << std::string(data, '\0');
}

// The message of the hymoe::Error that f throws (asserting it is a one-rank Exit::bad_input).
std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const hymoe::Error& e) {
        BOOST_TEST((e.code() == hymoe::Exit::bad_input));
        BOOST_TEST((e.scope() == hymoe::Scope::one_rank));
        return e.what();
    }
    return "no error";
}

// The error opening `path` raises.
std::string open_error(const std::string& path) {
    return error_of([&] { SafetensorsFile f(path); });
}

// `message` contains every one of `parts` (the message is shown when it does not).
boost::test_tools::assertion_result mentions(const std::string& message,
                                             const std::vector<std::string>& parts) {
    for (const std::string& p : parts) {
        if (message.find(p) == std::string::npos) {
            boost::test_tools::assertion_result r(false);
            r.message() << "'" << p << "' not in: " << message;
            return r;
        }
    }
    return true;
}

const std::string kOne = R"("w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]})";

}  // namespace

BOOST_AUTO_TEST_SUITE(safetensors)

BOOST_AUTO_TEST_CASE(round_trip_f32_bf16_f16) {
    Scratch s;
    Buffer a = ramp({3, 5});  // [3, 5]
    Buffer b = ramp({7}, -2.1f);
    Buffer c(DType::i64, {4});
    for (int i = 0; i < 4; ++i)
        c.ptr<int64_t>()[i] = (int64_t{1} << 40) + i;
    std::vector<std::pair<std::string, Tensor>> in = {
        {"b", b.view()}, {"a", a.view()}, {"ids", c.view()}};
    for (DType store : {DType::f32, DType::bf16, DType::f16}) {
        std::string path = s.path(std::string("t_") + hymoe::to_string(store) + ".safetensors");
        write_safetensors(path, in, {{"format", "pt"}, {"note", "test"}}, store);
        BOOST_TEST(!fs::exists(path + ".partial"));
        SafetensorsFile f(path);
        BOOST_TEST((f.names() == std::vector<std::string>{"a", "b", "ids"}));
        BOOST_TEST(f.metadata().at("format") == "pt");
        BOOST_TEST(f.metadata().at("note") == "test");
        BOOST_TEST((f.info("a").dtype == hymoe::io::st_dtype_of(store)));
        BOOST_TEST((f.info("a").shape == hymoe::Shape{3, 5}));
        BOOST_TEST(f.info("a").bytes == 15 * hymoe::dtype_size(store));
        BOOST_TEST((f.info("ids").dtype == StDType::i64));
        BOOST_TEST(f.info("ids").begin % 8 == 0);

        for (const Buffer* src : {&a, &b}) {
            const std::string name = src == &a ? "a" : "b";
            std::vector<float> want = floats(src->view());
            for (float& v : want) {
                if (store == DType::bf16)
                    v = hymoe::bf16_to_float(hymoe::float_to_bf16(v));
                if (store == DType::f16)
                    v = hymoe::f16_to_float(hymoe::float_to_f16(v));
            }
            Buffer got(DType::f32, src->view().shape);
            f.read(name, got.view());
            BOOST_TEST(floats(got.view()) == want, boost::test_tools::per_element());
            // Same-type copy: the stored bits come back unchanged.
            Buffer same(store, src->view().shape);
            f.read(name, same.view());
            BOOST_TEST(std::memcmp(same.view().data, f.raw(name), same.view().bytes()) == 0);
        }
        Buffer ids(DType::i64, {4});
        f.read("ids", ids.view());
        BOOST_TEST(std::memcmp(ids.view().data, c.view().data, 32) == 0);
        Buffer ids_f(DType::f32, {4});
        f.read("ids", ids_f.view());
        BOOST_TEST(ids_f.ptr<float>()[3] == static_cast<float>((int64_t{1} << 40) + 3));
    }
}

BOOST_AUTO_TEST_CASE(header_is_padded_to_8_bytes) {
    Scratch s;
    Buffer a = ramp({3});
    for (const char* meta : {"", "x", "xy", "xyz"}) {
        std::string path = s.path("p.safetensors");
        write_safetensors(path, {{"a", a.view()}}, {{"k", meta}});
        std::ifstream in(path, std::ios::binary);
        uint64_t len = 0;
        in.read(reinterpret_cast<char*>(&len), 8);
        BOOST_TEST(len % 8 == 0);
        BOOST_TEST(fs::file_size(path) == 8 + len + 6);
        SafetensorsFile f(path);
        BOOST_TEST(f.metadata().at("k") == meta);
    }
    write_safetensors(s.path("empty.safetensors"), {});
    BOOST_TEST(SafetensorsFile(s.path("empty.safetensors")).names().empty());
}

BOOST_AUTO_TEST_CASE(rows_and_slices_equal_the_whole) {
    Scratch s;
    Buffer w = ramp({6, 10});    // [n_out, n_in]
    Buffer e = ramp({4, 3, 5});  // [n_expert, 3, 5]
    std::string path = s.path("w.safetensors");
    write_safetensors(path, {{"w", w.view()}, {"e", e.view()}}, {}, DType::bf16);
    SafetensorsFile f(path);
    Buffer whole(DType::f32, {6, 10});
    f.read("w", whole.view());
    const float* full = whole.ptr<float>();

    Buffer rows(DType::f32, {2, 10});  // rows [3, 5)
    f.read_rows("w", 3, rows.view());
    for (int r = 0; r < 2; ++r)
        for (int c = 0; c < 10; ++c)
            BOOST_TEST(rows.ptr<float>()[r * 10 + c] == full[(3 + r) * 10 + c]);

    Buffer cols(DType::f32, {6, 4});  // columns [5, 9)
    f.read_slice("w", 1, 5, cols.view());
    for (int r = 0; r < 6; ++r)
        for (int c = 0; c < 4; ++c)
            BOOST_TEST(cols.ptr<float>()[r * 4 + c] == full[r * 10 + 5 + c]);

    Buffer cols_bf(DType::bf16, {6, 4});  // same slice, stored bits copied
    f.read_slice("w", -1, 5, cols_bf.view());
    for (int i = 0; i < 24; ++i)
        BOOST_TEST(hymoe::bf16_to_float(cols_bf.ptr<uint16_t>()[i]) == cols.ptr<float>()[i]);

    Buffer ew(DType::f32, {4, 3, 5});
    f.read("e", ew.view());
    Buffer mid(DType::f32, {4, 2, 5});  // dim 1, [1, 3)
    f.read_slice("e", 1, 1, mid.view());
    for (int x = 0; x < 4; ++x)
        for (int j = 0; j < 2; ++j)
            for (int k = 0; k < 5; ++k)
                BOOST_TEST(mid.ptr<float>()[(x * 2 + j) * 5 + k] ==
                           ew.ptr<float>()[(x * 3 + 1 + j) * 5 + k]);
    Buffer none(DType::f32, {0, 10});
    f.read_rows("w", 6, none.view());  // an empty slice at the end is fine
}

BOOST_AUTO_TEST_CASE(slice_out_of_range) {
    Scratch s;
    Buffer w = ramp({6, 10});
    std::string path = s.path("w.safetensors");
    write_safetensors(path, {{"w", w.view()}});
    SafetensorsFile f(path);
    Buffer rows(DType::f32, {2, 10});
    BOOST_TEST(mentions(error_of([&] { f.read_rows("w", 5, rows.view()); }),
                        {path, "tensor 'w'", "BF16 [6, 10]", "rows [5, 7)", "f32 [2, 10]"}));
    Buffer cols(DType::f32, {5, 4});  // wrong row count for a column slice
    BOOST_TEST(mentions(error_of([&] { f.read_slice("w", 1, 0, cols.view()); }),
                        {path, "tensor 'w'", "[0, 4) along dim 1", "f32 [5, 4]"}));
    BOOST_TEST(mentions(error_of([&] { f.read_slice("w", 2, 0, cols.view()); }),
                        {path, "tensor 'w'", "along dim 2"}));
}

BOOST_AUTO_TEST_CASE(sharded_folder_with_index) {
    Scratch s;
    Buffer a = ramp({4, 3}), b = ramp({5}), c = ramp({2, 2});
    write_safetensors(s.path("model-00001-of-00002.safetensors"),
                      {{"a", a.view()}, {"b", b.view()}});
    write_safetensors(s.path("model-00002-of-00002.safetensors"), {{"c", c.view()}});
    std::ofstream(s.path("model.safetensors.index.json"))
        << R"({"metadata": {"total_size": 50}, "weight_map": {)"
        << R"("a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",)"
        << R"("c": "model-00002-of-00002.safetensors"}})";
    SafetensorsFolder folder(s.dir.string());
    BOOST_TEST((folder.names() == std::vector<std::string>{"a", "b", "c"}));
    BOOST_TEST(folder.has("c"));
    BOOST_TEST(!folder.has("d"));
    folder.check_all();
    BOOST_TEST((folder.info("c").shape == hymoe::Shape{2, 2}));
    Buffer got(DType::f32, {2, 2});
    folder.read("c", got.view());
    for (int i = 0; i < 4; ++i)
        BOOST_TEST(got.ptr<float>()[i] ==
                   hymoe::bf16_to_float(hymoe::float_to_bf16(c.ptr<float>()[i])));
    Buffer row(DType::f32, {1, 3});
    folder.read_rows("a", 2, row.view());
    Buffer col(DType::f32, {4, 1});
    folder.read_slice("a", 1, 2, col.view());
    BOOST_TEST(row.ptr<float>()[2] == col.ptr<float>()[2]);  // both are a[2][2]
    BOOST_TEST(folder.file_of("a").path() == s.path("model-00001-of-00002.safetensors"));
}

BOOST_AUTO_TEST_CASE(single_file_folder) {
    Scratch s;
    Buffer a = ramp({4, 3});
    write_safetensors(s.path("model.safetensors"), {{"a", a.view()}}, {}, DType::f32);
    SafetensorsFolder folder(s.dir.string());
    Buffer got(DType::f32, {4, 3});
    folder.read("a", got.view());
    BOOST_TEST(floats(got.view()) == floats(a.view()), boost::test_tools::per_element());
    SafetensorsFolder file(s.path("model.safetensors"));  // a file path works too
    BOOST_TEST((file.names() == std::vector<std::string>{"a"}));
}

// ---- malformed files ----------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(shorter_than_8_bytes) {
    Scratch s;
    std::string path = s.path("short.safetensors");
    std::ofstream(path) << "abc";
    BOOST_TEST(mentions(open_error(path), {path, "3 bytes", "8-byte header length"}));
    std::ofstream(s.path("empty.safetensors")).flush();
    BOOST_TEST(mentions(open_error(s.path("empty.safetensors")), {"empty.safetensors", "0 bytes"}));
}

BOOST_AUTO_TEST_CASE(header_length_beyond_the_file) {
    Scratch s;
    std::string path = s.path("long.safetensors");
    raw_file(path, "{" + kOne + "}", 16, 5000);
    BOOST_TEST(mentions(open_error(path), {path, "header length 5000", "past the end"}));
    raw_file(path, "{}", 0, int64_t{1} << 40);
    BOOST_TEST(mentions(open_error(path), {path, "header length 1099511627776", "implausible"}));
}

BOOST_AUTO_TEST_CASE(data_cut_short) {
    Scratch s;
    Buffer a = ramp({64});
    std::string path = s.path("cut.safetensors");
    write_safetensors(path, {{"a", a.view()}}, {}, DType::f32);
    fs::resize_file(path, fs::file_size(path) - 10);
    BOOST_TEST(
        mentions(open_error(path),
                 {path, "tensor 'a'", "data_offsets [0, 256]", "past the end", "246 bytes"}));
}

BOOST_AUTO_TEST_CASE(bad_json) {
    Scratch s;
    std::string path = s.path("json.safetensors");
    raw_file(path, R"({"w": {"dtype": "F32", )", 0);
    BOOST_TEST(mentions(open_error(path), {path, "not valid JSON", "parse error"}));
    raw_file(path, "", 0);
    BOOST_TEST(mentions(open_error(path), {path, "not valid JSON"}));
}

BOOST_AUTO_TEST_CASE(header_not_an_object) {
    Scratch s;
    std::string path = s.path("array.safetensors");
    raw_file(path, "[1, 2]", 0);
    BOOST_TEST(mentions(open_error(path), {path, "header is a JSON array, not an object"}));
    raw_file(path, R"({"w": [1, 2]})", 0);
    BOOST_TEST(mentions(open_error(path), {path, "tensor 'w'", "not an object"}));
    raw_file(path, R"({"__metadata__": {"a": 1}})", 0);
    BOOST_TEST(mentions(open_error(path), {path, "__metadata__", "'a'", "not a string"}));
}

BOOST_AUTO_TEST_CASE(unknown_dtype) {
    Scratch s;
    std::string path = s.path("dtype.safetensors");
    raw_file(path, R"({"w": {"dtype": "Q4_K", "shape": [2], "data_offsets": [0, 2]}})", 2);
    BOOST_TEST(mentions(open_error(path), {path, "tensor 'w'", "unknown dtype 'Q4_K'"}));
    raw_file(path, R"({"w": {"shape": [2], "data_offsets": [0, 2]}})", 2);
    BOOST_TEST(mentions(open_error(path), {path, "tensor 'w'", "\"dtype\" is missing"}));
}

BOOST_AUTO_TEST_CASE(known_but_unconvertible_dtype) {
    Scratch s;
    std::string path = s.path("fp8.safetensors");
    raw_file(path, R"({"w": {"dtype": "F8_E4M3", "shape": [2, 3], "data_offsets": [0, 6]}})", 6);
    SafetensorsFile f(path);  // FP8 (DeepSeek-V3.2's weights) is a known type
    BOOST_TEST((f.info("w").dtype == StDType::f8_e4m3));
    Buffer got(DType::f32, {2, 3});
    BOOST_TEST(mentions(error_of([&] { f.read("w", got.view()); }),
                        {path, "tensor 'w'", "F8_E4M3", "cannot be read into a f32"}));
}

BOOST_AUTO_TEST_CASE(offsets_out_of_range) {
    Scratch s;
    std::string path = s.path("range.safetensors");
    raw_file(path, R"({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [16, 32]}})", 20);
    BOOST_TEST(mentions(open_error(path),
                        {path,
                         "tensor 'w'",
                         "data_offsets [16, 32]",
                         "past the end of the data section (20 bytes"}));
    raw_file(path, R"({"w": {"dtype": "F32", "shape": [0], "data_offsets": [8, 4]}})", 20);
    BOOST_TEST(mentions(open_error(path), {path, "tensor 'w'", "end before they begin"}));
    raw_file(path, R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}})", 20);
    BOOST_TEST(mentions(open_error(path), {path, "tensor 'w'", "\"data_offsets\""}));
    raw_file(path, R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4, 8]}})", 20);
    BOOST_TEST(mentions(open_error(path), {path, "tensor 'w'", "\"data_offsets\""}));
}

BOOST_AUTO_TEST_CASE(offsets_not_matching_shape_and_dtype) {
    Scratch s;
    std::string path = s.path("model-00001-of-00002.safetensors");
    raw_file(path,
             R"({"model.layers.0.mlp.gate_proj.weight": )"
             R"({"dtype": "BF16", "shape": [4, 16], "data_offsets": [0, 100]}})",
             128);
    BOOST_TEST(mentions(open_error(path),
                        {path + ": tensor 'model.layers.0.mlp.gate_proj.weight': data_offsets "
                                "[0, 100] hold 100 bytes but BF16 [4, 16] needs 128"}));
}

BOOST_AUTO_TEST_CASE(overlapping_tensors) {
    Scratch s;
    std::string path = s.path("overlap.safetensors");
    raw_file(path,
             R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},)"
             R"( "b": {"dtype": "F32", "shape": [4], "data_offsets": [12, 28]},)"
             R"( "z": {"dtype": "F32", "shape": [0], "data_offsets": [4, 4]}})",
             28);
    BOOST_TEST(mentions(open_error(path), {path, "'a' [0, 16]", "'b' [12, 28]", "overlap"}));
}

BOOST_AUTO_TEST_CASE(duplicate_tensor_name) {
    Scratch s;
    std::string path = s.path("dup.safetensors");
    raw_file(path,
             R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},)"
             R"( "w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
             8);
    BOOST_TEST(mentions(open_error(path), {path, "tensor 'w'", "more than once"}));
    raw_file(path,
             R"({"w": {"dtype": "F32", "shape": [1], "dtype": "F16", "data_offsets": [0, 4]}})",
             8);
    BOOST_TEST(mentions(open_error(path), {path, "tensor 'w'", "key 'dtype'", "more than once"}));
}

BOOST_AUTO_TEST_CASE(negative_shape) {
    Scratch s;
    std::string path = s.path("neg.safetensors");
    raw_file(path, R"({"w": {"dtype": "F32", "shape": [4, -1], "data_offsets": [0, 0]}})", 0);
    BOOST_TEST(mentions(open_error(path), {path, "tensor 'w'", "shape [4, -1]", "non-negative"}));
    raw_file(path, R"({"w": {"dtype": "F32", "shape": [2.5], "data_offsets": [0, 0]}})", 0);
    BOOST_TEST(mentions(open_error(path), {path, "tensor 'w'", "non-negative integer"}));
    raw_file(
        path,
        R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 0]}})",
        0);
    BOOST_TEST(mentions(open_error(path), {path, "tensor 'w'", "too large"}));
}

BOOST_AUTO_TEST_CASE(index_points_to_a_missing_shard) {
    Scratch s;
    Buffer a = ramp({2});
    write_safetensors(s.path("model-00001-of-00002.safetensors"), {{"a", a.view()}});
    std::ofstream(s.path("model.safetensors.index.json"))
        << R"({"weight_map": {"a": "model-00001-of-00002.safetensors",)"
        << R"( "b": "model-00002-of-00002.safetensors"}})";
    SafetensorsFolder folder(s.dir.string());
    Buffer got(DType::f32, {2});
    folder.read("a", got.view());  // the shard that is there still reads
    BOOST_TEST(mentions(error_of([&] { folder.read("b", got.view()); }),
                        {s.path("model-00002-of-00002.safetensors"), "missing", "tensor 'b'"}));
    BOOST_TEST(mentions(error_of([&] { folder.check_all(); }), {"model-00002-of-00002"}));
}

BOOST_AUTO_TEST_CASE(tensor_missing_from_its_shard) {
    Scratch s;
    Buffer a = ramp({2});
    write_safetensors(s.path("shard.safetensors"), {{"a", a.view()}});
    std::ofstream(s.path("model.safetensors.index.json"))
        << R"({"weight_map": {"a": "shard.safetensors", "b": "shard.safetensors"}})";
    SafetensorsFolder folder(s.dir.string());
    BOOST_TEST(mentions(error_of([&] { folder.info("b"); }),
                        {s.path("shard.safetensors"), "tensor 'b'", "not in this shard"}));
}

BOOST_AUTO_TEST_CASE(bad_index) {
    Scratch s;
    std::string index = s.path("model.safetensors.index.json");
    auto folder_error = [&](const std::string& text) {
        std::ofstream(index) << text;
        return error_of([&] { SafetensorsFolder f(s.dir.string()); });
    };
    BOOST_TEST(mentions(folder_error(R"({"weight_map": {"a": )"), {index, "not valid JSON"}));
    BOOST_TEST(mentions(folder_error(R"({"metadata": {}})"), {index, "no \"weight_map\""}));
    BOOST_TEST(mentions(folder_error(R"({"weight_map": {"a": 3}})"), {index, "tensor 'a'"}));
    BOOST_TEST(mentions(folder_error(R"({"weight_map": {"a": "../x.safetensors"}})"),
                        {index, "tensor 'a'", "not a file name in the folder"}));
    BOOST_TEST(mentions(folder_error(R"({"weight_map": {"a": "x", "a": "y"}})"),
                        {index, "tensor 'a'", "more than once"}));
    fs::remove(index);
    BOOST_TEST(mentions(error_of([&] { SafetensorsFolder f(s.dir.string()); }),
                        {s.dir.string(), "neither"}));
    BOOST_TEST(mentions(error_of([&] { SafetensorsFolder f(s.path("nope")); }),
                        {s.path("nope"), "no such folder"}));
}

BOOST_AUTO_TEST_CASE(requested_tensor_missing) {
    Scratch s;
    Buffer a = ramp({2}), b = ramp({3});
    write_safetensors(s.path("model.safetensors"), {{"a", a.view()}, {"b", b.view()}});
    SafetensorsFile f(s.path("model.safetensors"));
    BOOST_TEST(mentions(error_of([&] { f.info("lm_head.weight"); }),
                        {s.path("model.safetensors"),
                         "tensor 'lm_head.weight' is missing",
                         "(2 tensors in the file)"}));
    SafetensorsFolder folder(s.dir.string());
    Buffer got(DType::f32, {2});
    BOOST_TEST(mentions(error_of([&] { folder.read("lm_head.weight", got.view()); }),
                        {s.dir.string() + ": tensor 'lm_head.weight' is missing (2 tensors in "
                                          "the checkpoint)"}));
}

BOOST_AUTO_TEST_CASE(shape_mismatch_on_read) {
    Scratch s;
    Buffer a = ramp({4, 16});
    std::string path = s.path("model.safetensors");
    write_safetensors(path, {{"w", a.view()}});
    SafetensorsFile f(path);
    Buffer got(DType::f32, {4, 8});
    BOOST_TEST(mentions(error_of([&] { f.read("w", got.view()); }),
                        {path, "tensor 'w' is BF16 [4, 16] but the destination is f32 [4, 8]"}));
}

BOOST_AUTO_TEST_CASE(missing_file) {
    Scratch s;
    BOOST_TEST(mentions(open_error(s.path("nope.safetensors")),
                        {s.path("nope.safetensors"), "cannot open"}));
    BOOST_TEST(mentions(open_error(s.dir.string()), {s.dir.string(), "not a regular file"}));
}

BOOST_AUTO_TEST_SUITE_END()
