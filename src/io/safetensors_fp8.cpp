// FP8 block-scaled weights in safetensors (io/safetensors.h Fp8Blocks): the e4m3 decode, a
// file's dequantizing slice read, and the folder's checks that pair each F8_E4M3 weight with its
// "<name>_scale_inv" block scales. A rank's slice reads only its rows or columns of the codes
// and, per element, the scale of the 128×128 block it lies in, so a block cut by a rank boundary
// dequantizes exactly as in the whole tensor.
#include <cmath>
#include <cstring>
#include <vector>

#include "hymoe/core/error.h"
#include "hymoe/io/safetensors.h"
#include "safetensors_detail.h"

namespace hymoe::io {

namespace {

// e4m3 code -> value, all 256 (OCP FP8 E4M3 "fn": s eeee mmm, bias 7).
struct E4m3Table {
    float v[256];
    E4m3Table() {
        for (int c = 0; c < 256; ++c) {
            const int e = (c >> 3) & 15, m = c & 7;
            float x = e == 0 ? std::ldexp(static_cast<float>(m), -9)  // subnormal: m/8 · 2^-6
                             : std::ldexp(static_cast<float>(8 + m), e - 10);  // (1+m/8) · 2^(e-7)
            if (e == 15 && m == 7)
                x = std::nanf("");
            v[c] = (c & 128) ? -x : x;
        }
    }
};
const E4m3Table kE4m3;

int64_t ceil_div(int64_t a, int64_t b) {
    return (a + b - 1) / b;
}

}  // namespace

float e4m3_to_float(uint8_t code) {
    return kE4m3.v[code];
}

void SafetensorsFile::read_slice_fp8(const std::string& name,
                                     int dim,
                                     int64_t begin,
                                     const Tensor& scale,
                                     const Fp8Blocks& blocks,
                                     Tensor& dest) const {
    const SafetensorsInfo& t = info(name);
    HYMOE_CHECK(t.dtype == StDType::f8_e4m3 && t.shape.size() == 2 && scale.dtype == DType::f32,
                "read_slice_fp8 of '",
                name,
                "'");
    const int d = check_slice(name, dim, begin, dest);
    HYMOE_CHECK(detail::is_float_dtype(dest.dtype) && dest.device == Device::cpu,
                "FP8 weights dequantize into a host float tensor");
    const int64_t n_in = t.shape[1], rows = dest.shape[0], cols = dest.shape[1];
    const int64_t r0 = d == 0 ? begin : 0, c0 = d == 1 ? begin : 0;  // the slice in the whole
    const int64_t scale_cols = scale.shape[1];
    const auto* codes = data_ + t.begin;  // [out, in] e4m3
    const float* s = scale.ptr<float>();  // [ceil(out/rows), ceil(in/cols)]
    auto* dst = static_cast<unsigned char*>(dest.data);
    const size_t row_bytes = static_cast<size_t>(cols) * dtype_size(dest.dtype);
    std::vector<float> w(static_cast<size_t>(cols));  // [cols] one dequantized row in fp32
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t i = r0 + r;
        const unsigned char* q = codes + i * n_in + c0;
        const float* s_row = s + (i / blocks.rows) * scale_cols;
        for (int64_t c = 0; c < cols; ++c)
            w[static_cast<size_t>(c)] = kE4m3.v[q[c]] * s_row[(c0 + c) / blocks.cols];
        detail::convert(reinterpret_cast<const unsigned char*>(w.data()),
                        StDType::f32,
                        dst + static_cast<size_t>(r) * row_bytes,
                        dest.dtype,
                        static_cast<size_t>(cols));
    }
}

void SafetensorsFolder::set_fp8(const Fp8Blocks& blocks, const std::string& config) {
    fp8_ = blocks;
    fp8_config_ = config;
}

bool SafetensorsFolder::read_fp8(
    const std::string& name, bool whole, int dim, int64_t begin, Tensor& dest) const {
    const SafetensorsFile& file = file_of(name);
    const SafetensorsInfo& t = file.info(name);
    const std::string scale_name = name + "_scale_inv";
    const bool fp8 = t.dtype == StDType::f8_e4m3 || t.dtype == StDType::f8_e5m2;
    if (!fp8 && !(fp8_ && has(scale_name)))
        return false;
    const std::string where = cat(file.path(), ": tensor '", name, "'");
    if (!fp8_)
        HYMOE_FAIL_ONE(Exit::bad_input,
                       where,
                       " is ",
                       to_string(t.dtype),
                       " but the model config has no quantization_config of quant_method fp8");
    if (t.dtype == StDType::f8_e5m2)
        HYMOE_FAIL_ONE(Exit::bad_input,
                       where,
                       " is F8_E5M2 but ",
                       fp8_config_,
                       " says quantization_config.fmt e4m3");
    if (!fp8)
        HYMOE_FAIL_ONE(Exit::bad_input,
                       where,
                       " is ",
                       to_string(t.dtype),
                       " but has block scales '",
                       scale_name,
                       "': only F8_E4M3 weights are block-scaled");
    if (t.shape.size() != 2)
        HYMOE_FAIL_ONE(Exit::bad_input,
                       where,
                       " is F8_E4M3 ",
                       shape_string(t.shape),
                       ": block-scaled FP8 weights are matrices [out, in]");
    if (!has(scale_name))
        HYMOE_FAIL_ONE(Exit::bad_input,
                       where,
                       " is F8_E4M3 but its block scales '",
                       scale_name,
                       "' are missing from ",
                       dir_);
    const SafetensorsFile& sfile = file_of(scale_name);
    const SafetensorsInfo& si = sfile.info(scale_name);
    const Shape want = {ceil_div(t.shape[0], fp8_->rows), ceil_div(t.shape[1], fp8_->cols)};
    const bool float_scale =
        si.dtype == StDType::f32 || si.dtype == StDType::bf16 || si.dtype == StDType::f16;
    if (si.shape != want || !float_scale)
        HYMOE_FAIL_ONE(Exit::bad_input,
                       sfile.path(),
                       ": tensor '",
                       scale_name,
                       "' is ",
                       to_string(si.dtype),
                       " ",
                       shape_string(si.shape),
                       " but the block scales of '",
                       name,
                       "' (F8_E4M3 ",
                       shape_string(t.shape),
                       ", blocks ",
                       fp8_->rows,
                       "x",
                       fp8_->cols,
                       ") are float ",
                       shape_string(want));
    Buffer scale(DType::f32, want);
    sfile.read(scale_name, scale.view());
    const float* s = scale.ptr<float>();
    for (int64_t k = 0; k < want[0] * want[1]; ++k)
        if (!std::isfinite(s[k]))
            HYMOE_FAIL_ONE(Exit::bad_input,
                           sfile.path(),
                           ": tensor '",
                           scale_name,
                           "' holds a non-finite scale at [",
                           k / want[1],
                           ", ",
                           k % want[1],
                           "]");
    if (whole && dest.shape != t.shape)
        HYMOE_FAIL_ONE(Exit::bad_input,
                       where,
                       " is F8_E4M3 ",
                       shape_string(t.shape),
                       " but the destination is ",
                       to_string(dest.dtype),
                       " ",
                       shape_string(dest.shape));
    file.read_slice_fp8(name, dim, begin, scale.view(), *fp8_, dest);
    return true;
}

}  // namespace hymoe::io
