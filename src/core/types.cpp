// Names of element types and devices; IEEE binary16 conversions (round to nearest even).
#include "hymoe/core/types.h"

namespace hymoe {

const char* to_string(DType t) {
    switch (t) {
        case DType::f32:
            return "f32";
        case DType::f16:
            return "f16";
        case DType::bf16:
            return "bf16";
        case DType::i32:
            return "i32";
        case DType::i64:
            return "i64";
        case DType::u8:
            return "u8";
    }
    return "?";
}

const char* to_string(Device d) {
    return d == Device::cpu ? "cpu" : "cuda";
}

float f16_to_float(uint16_t h) {
    uint32_t sign = uint32_t{h & 0x8000u} << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0x1f)  // inf / NaN
        return bits_float(sign | 0x7f800000u | (man << 13));
    if (exp == 0) {  // zero / subnormal: man * 2^-24
        float v = static_cast<float>(man) * 5.9604644775390625e-8f;
        return sign ? -v : v;
    }
    return bits_float(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t float_to_f16(float x) {
    uint32_t u = float_bits(x);
    uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
    uint32_t abs = u & 0x7fffffffu;
    if (abs > 0x7f800000u)  // NaN
        return static_cast<uint16_t>(sign | 0x7e00u);
    if (abs >= 0x477ff000u)  // rounds to >= 65520: inf
        return static_cast<uint16_t>(sign | 0x7c00u);
    if (abs < 0x38800000u) {  // below the smallest normal 2^-14: subnormal or zero
        // value * 2^24 rounded to an integer (nearest even) gives the subnormal mantissa
        float v = bits_float(abs) * 16777216.0f;
        uint32_t m = static_cast<uint32_t>(v);
        float frac = v - static_cast<float>(m);
        if (frac > 0.5f || (frac == 0.5f && (m & 1u)))
            ++m;
        return static_cast<uint16_t>(sign | m);
    }
    uint32_t mant = abs + 0xfffu + ((abs >> 13) & 1u);  // round to nearest even at bit 13
    return static_cast<uint16_t>(sign | (((mant >> 13) - (112u << 10)) & 0x7fffu));
}

}  // namespace hymoe
