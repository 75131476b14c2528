// FP8 block-scaled weights in safetensors (io/safetensors.h Fp8Blocks): the decode table against
// the format's definition for all 256 e4m3 codes; a random matrix quantized the DeepSeek-V3 way
// (tests/fp8_quant.h) reads back, whole and as row and column slices that cut blocks, equal bit
// for bit to the reference dequantization (fp32, and bf16 as that fp32 rounded); and each bad
// input (missing or misshapen scales, scales beside a BF16 weight, an F8_E5M2 weight, FP8 without
// a quantization_config) is Exit::bad_input naming the file and the tensor.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <unistd.h>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "../../fp8_quant.h"
#include "hymoe/core/error.h"
#include "hymoe/core/rng.h"
#include "hymoe/io/safetensors.h"

namespace fs = std::filesystem;
using namespace hymoe;
using hymoe::io::SafetensorsFolder;
using hymoe::testing::Fp8Matrix;
using hymoe::testing::RawTensor;

namespace {

struct Scratch {
    fs::path dir;
    Scratch() {
        static int n = 0;
        dir = fs::temp_directory_path() /
              ("hymoe_fp8_test_" + std::to_string(::getpid()) + "_" + std::to_string(n++));
        fs::create_directories(dir);
    }
    ~Scratch() { fs::remove_all(dir); }
    std::string path(const std::string& name) const { return (dir / name).string(); }
};

// A [out, in] matrix of normal(0, 0.02) values with a few large ones, quantized in 128 × 128
// blocks (amax differs block to block).
Fp8Matrix random_fp8(int64_t out, int64_t in, uint64_t seed) {
    std::vector<float> w(static_cast<size_t>(out * in));
    Philox rng(seed, 0, 0);
    rng.fill_normal(w.data(), w.size(), 0.0f, 0.02f);
    for (size_t k = 0; k < w.size(); k += 977)
        w[k] *= 40.0f;
    return testing::quantize_fp8(w.data(), out, in, 128, 128);
}

RawTensor codes_of(const std::string& name, const Fp8Matrix& q, const std::string& dtype) {
    return {name, dtype, {q.out, q.in}, {q.codes.begin(), q.codes.end()}};
}
RawTensor scales_of(const std::string& name, const Fp8Matrix& q) {
    return testing::raw_f32(name, {q.scale_rows(), q.scale_cols()}, q.scale);
}

int code_of(const std::function<void()>& f, std::string& what) {
    try {
        f();
    } catch (const Error& e) {
        what = e.what();
        return static_cast<int>(e.code());
    }
    return 0;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(safetensors_fp8)

BOOST_AUTO_TEST_CASE(e4m3_decode_table_matches_the_format_for_all_256_codes) {
    int nans = 0;
    for (int c = 0; c < 256; ++c) {
        const float got = io::e4m3_to_float(static_cast<uint8_t>(c));
        const double want = testing::e4m3_value(c);
        if (std::isnan(want)) {
            BOOST_TEST(std::isnan(got), "code " << c);
            ++nans;
            continue;
        }
        BOOST_TEST(static_cast<double>(got) == want, "code " << c);
        BOOST_TEST(std::signbit(got) == ((c & 128) != 0), "code " << c);
    }
    BOOST_TEST(nans == 2);  // 0x7f and 0xff only: e4m3 "fn" has no infinities
    BOOST_TEST(io::e4m3_to_float(0x7e) == 448.0f);
    BOOST_TEST(io::e4m3_to_float(0xfe) == -448.0f);
    BOOST_TEST(io::e4m3_to_float(0x38) == 1.0f);
    BOOST_TEST(io::e4m3_to_float(0x01) == std::ldexp(1.0f, -9));  // smallest subnormal
    BOOST_TEST(io::e4m3_to_float(0x08) == std::ldexp(1.0f, -6));  // smallest normal
    BOOST_TEST(io::e4m3_to_float(0x7f) != io::e4m3_to_float(0x7f));
    // the test's encoder: round to nearest even, saturating
    BOOST_TEST(testing::e4m3_encode(1000.0f) == 0x7e);
    BOOST_TEST(testing::e4m3_encode(1.0625f) == 0x38);  // halfway 1 .. 1.125: to the even code
    BOOST_TEST(testing::e4m3_encode(1.1875f) == 0x3a);  // halfway 1.125 .. 1.25: to the even code
}

BOOST_AUTO_TEST_CASE(slices_dequantize_bit_for_bit_like_the_reference) {
    Scratch s;
    // out 320 (blocks of 128, 128, 64), in 192 (128 and a partial 64)
    const Fp8Matrix q = random_fp8(320, 192, 3);
    BOOST_TEST(q.scale_rows() == 3);
    BOOST_TEST(q.scale_cols() == 2);
    testing::write_raw_safetensors(
        s.path("model.safetensors"),
        {scales_of("w.weight_scale_inv", q), codes_of("w.weight", q, "F8_E4M3")});
    SafetensorsFolder folder(s.dir.string());
    folder.set_fp8({128, 128}, "config.json");
    const std::vector<float> ref = q.dequantized();

    Buffer whole(DType::f32, {320, 192});
    folder.read("w.weight", whole.view());
    BOOST_TEST(std::memcmp(whole.ptr<float>(), ref.data(), ref.size() * 4) == 0);

    // rows [96, 256): cut through the first and second block rows (a tp rank's part)
    Buffer rows(DType::f32, {160, 192});
    folder.read_slice("w.weight", 0, 96, rows.view());
    BOOST_TEST(std::memcmp(rows.ptr<float>(), ref.data() + 96 * 192, 160 * 192 * 4) == 0);

    // columns [96, 192): half of the first block column and the partial one
    Buffer cols(DType::f32, {320, 96});
    folder.read_slice("w.weight", 1, 96, cols.view());
    int64_t bad = 0;
    for (int64_t i = 0; i < 320; ++i)
        for (int64_t j = 0; j < 96; ++j)
            bad += std::memcmp(&cols.ptr<float>()[i * 96 + j], &ref[i * 192 + 96 + j], 4) != 0;
    BOOST_TEST(bad == 0);

    // into bf16: the fp32 product rounded to nearest even
    Buffer half(DType::bf16, {320, 192});
    folder.read("w.weight", half.view());
    const auto* h = half.ptr<uint16_t>();
    bad = 0;
    for (size_t k = 0; k < ref.size(); ++k)
        bad += h[k] != float_to_bf16(ref[k]);
    BOOST_TEST(bad == 0);
}

BOOST_AUTO_TEST_CASE(bad_fp8_inputs_exit_3_naming_file_and_tensor) {
    Scratch s;
    const Fp8Matrix q = random_fp8(192, 256, 4);
    const Fp8Matrix other = random_fp8(128, 256, 5);  // scales of the wrong shape [1, 2]
    const std::string file = s.path("model.safetensors");
    auto check = [&](const std::vector<RawTensor>& ts,
                     bool configured,
                     const std::string& name,
                     const std::string& says) {
        testing::write_raw_safetensors(file, ts);
        SafetensorsFolder folder(s.dir.string());
        if (configured)
            folder.set_fp8({128, 128}, "x/config.json");
        Buffer dest(DType::f32, {192, 256});
        std::string what;
        BOOST_TEST(code_of([&] { folder.read("w.weight", dest.view()); }, what) == 3, what);
        BOOST_TEST(what.find(file) != std::string::npos, what);
        BOOST_TEST(what.find("'" + name + "'") != std::string::npos, what);
        BOOST_TEST(what.find(says) != std::string::npos, what);
    };
    check(
        {codes_of("w.weight", q, "F8_E4M3")}, true, "w.weight", "'w.weight_scale_inv' are missing");
    check({scales_of("w.weight_scale_inv", other), codes_of("w.weight", q, "F8_E4M3")},
          true,
          "w.weight_scale_inv",
          "is F32 [1, 2] but the block scales of 'w.weight' (F8_E4M3 [192, 256], blocks "
          "128x128) are float [2, 2]");
    check({scales_of("w.weight_scale_inv", q), codes_of("w.weight", q, "F8_E5M2")},
          true,
          "w.weight",
          "F8_E5M2 but x/config.json says quantization_config.fmt e4m3");
    check({codes_of("w.weight", q, "F8_E4M3")}, false, "w.weight", "no quantization_config");
    std::vector<unsigned char> bf16(static_cast<size_t>(192 * 256 * 2), 0);
    check({scales_of("w.weight_scale_inv", q), {"w.weight", "BF16", {192, 256}, bf16}},
          true,
          "w.weight",
          "only F8_E4M3 weights are block-scaled");
}

BOOST_AUTO_TEST_SUITE_END()
