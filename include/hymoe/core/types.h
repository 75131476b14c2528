// Element types and devices shared by every module, with the bf16/fp16 <-> fp32 conversions the
// CPU code uses (round to nearest even, NaN kept quiet). Storage types are plain uint16_t.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace hymoe {

enum class DType { f32, f16, bf16, i32, i64, u8 };
enum class Device { cpu, cuda };

constexpr size_t dtype_size(DType t) {
    switch (t) {
        case DType::f32:
            return 4;
        case DType::f16:
            return 2;
        case DType::bf16:
            return 2;
        case DType::i32:
            return 4;
        case DType::i64:
            return 8;
        case DType::u8:
            return 1;
    }
    return 0;
}

const char* to_string(DType t);
const char* to_string(Device d);

inline uint32_t float_bits(float x) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    return u;
}
inline float bits_float(uint32_t u) {
    float x;
    std::memcpy(&x, &u, 4);
    return x;
}

inline float bf16_to_float(uint16_t h) {
    return bits_float(uint32_t{h} << 16);
}
inline uint16_t float_to_bf16(float x) {
    uint32_t u = float_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u)  // NaN: keep it a (quiet) NaN
        return static_cast<uint16_t>((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
    return static_cast<uint16_t>(u >> 16);
}

float f16_to_float(uint16_t h);
uint16_t float_to_f16(float x);

}  // namespace hymoe
