// Test helpers for FP8 block-scaled checkpoints (io/safetensors.h Fp8Blocks), shared by the unit
// and e2e tests: an e4m3 encoder independent of the reader's decode (nearest of the 254 finite
// values by brute force, ties to the even code, saturating at ±448), DeepSeek-V3's block
// quantization of a matrix (per block: scale = amax / 448, codes = e4m3(w / scale); the file's
// weight_scale_inv is that scale, what the reader multiplies by), the reference dequantization,
// and a writer of safetensors files holding raw F8_E4M3 bytes (hymoe's writer stores float types
// only).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace hymoe::testing {

// The e4m3 value of a code from the format's definition (s eeee mmm, bias 7, e = 0 subnormal,
// S.1111.111 NaN), in double.
inline double e4m3_value(int code) {
    const int e = (code >> 3) & 15, m = code & 7;
    if (e == 15 && m == 7)
        return std::nan("");
    const double mag =
        e == 0 ? m / 8.0 * std::pow(2.0, -6) : (1.0 + m / 8.0) * std::pow(2.0, e - 7);
    return (code & 128) ? -mag : mag;
}

// Round to nearest e4m3, ties to the even code, saturating.
inline uint8_t e4m3_encode(float x) {
    int best = 0;
    double best_err = INFINITY;
    for (int c = 0; c < 256; ++c) {
        const double v = e4m3_value(c);
        if (std::isnan(v) || (v == 0.0 && std::signbit(v) != std::signbit(x)))
            continue;
        const double err = std::abs(v - static_cast<double>(std::clamp(x, -448.0f, 448.0f)));
        if (err < best_err || (err == best_err && (c & 1) == 0)) {
            best = c;
            best_err = err;
        }
    }
    return static_cast<uint8_t>(best);
}

// A matrix [out, in] quantized per [br, bc] block.
struct Fp8Matrix {
    int64_t out = 0, in = 0, br = 128, bc = 128;
    std::vector<uint8_t> codes;  // [out, in]
    std::vector<float> scale;    // [ceil(out/br), ceil(in/bc)] weight_scale_inv
    int64_t scale_rows() const { return (out + br - 1) / br; }
    int64_t scale_cols() const { return (in + bc - 1) / bc; }
    // The reference dequantization: code value × its block's scale, in fp32.
    float at(int64_t i, int64_t j) const {
        return static_cast<float>(e4m3_value(codes[static_cast<size_t>(i * in + j)])) *
               scale[static_cast<size_t>((i / br) * scale_cols() + j / bc)];
    }
    std::vector<float> dequantized() const {
        std::vector<float> w(static_cast<size_t>(out * in));
        for (int64_t i = 0; i < out; ++i)
            for (int64_t j = 0; j < in; ++j)
                w[static_cast<size_t>(i * in + j)] = at(i, j);
        return w;
    }
};

inline Fp8Matrix quantize_fp8(const float* w, int64_t out, int64_t in, int64_t br, int64_t bc) {
    Fp8Matrix q;
    q.out = out, q.in = in, q.br = br, q.bc = bc;
    q.codes.resize(static_cast<size_t>(out * in));
    q.scale.resize(static_cast<size_t>(q.scale_rows() * q.scale_cols()));
    for (int64_t bi = 0; bi < q.scale_rows(); ++bi)
        for (int64_t bj = 0; bj < q.scale_cols(); ++bj) {
            const int64_t i1 = std::min(out, (bi + 1) * br), j1 = std::min(in, (bj + 1) * bc);
            float amax = 0;
            for (int64_t i = bi * br; i < i1; ++i)
                for (int64_t j = bj * bc; j < j1; ++j)
                    amax = std::max(amax, std::abs(w[i * in + j]));
            const float s = amax > 0 ? amax / 448.0f : 1.0f;
            q.scale[static_cast<size_t>(bi * q.scale_cols() + bj)] = s;
            for (int64_t i = bi * br; i < i1; ++i)
                for (int64_t j = bj * bc; j < j1; ++j)
                    q.codes[static_cast<size_t>(i * in + j)] = e4m3_encode(w[i * in + j] / s);
        }
    return q;
}

// One tensor of a raw safetensors file: its header dtype ("F8_E4M3", "F32", ...) and bytes.
struct RawTensor {
    std::string name, dtype;
    std::vector<int64_t> shape;
    std::vector<unsigned char> bytes;
};

inline RawTensor raw_f32(const std::string& name,
                         std::vector<int64_t> shape,
                         const std::vector<float>& v) {
    RawTensor t{name, "F32", std::move(shape), std::vector<unsigned char>(v.size() * 4)};
    std::memcpy(t.bytes.data(), v.data(), t.bytes.size());
    return t;
}

inline void write_raw_safetensors(const std::string& path, const std::vector<RawTensor>& ts) {
    nlohmann::json header = nlohmann::json::object();
    std::vector<size_t> at;  // each tensor's offset, 8-aligned (gaps are allowed)
    size_t offset = 0;
    for (const RawTensor& t : ts) {
        at.push_back(offset);
        header[t.name] = {{"dtype", t.dtype},
                          {"shape", t.shape},
                          {"data_offsets", {offset, offset + t.bytes.size()}}};
        offset = (offset + t.bytes.size() + 7) / 8 * 8;
    }
    std::string text = header.dump();
    text.append((8 - text.size() % 8) % 8, ' ');
    const uint64_t n = text.size();
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(&n), 8);
    f << text;
    for (size_t k = 0; k < ts.size(); ++k) {
        const std::vector<unsigned char>& b = ts[k].bytes;
        f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
        const size_t end = k + 1 < ts.size() ? at[k + 1] : at[k] + b.size();
        f << std::string(end - at[k] - b.size(), '\0');
    }
}

}  // namespace hymoe::testing
