// Philox4x32-10 (Salmon et al. 2011, Random123 philox.h): see rng.h for the keying. Box-Muller maps
// two uniforms u1 in (0, 1], u2 in [0, 1) to r = sqrt(-2 ln u1), z = (r cos 2 pi u2, r sin 2 pi
// u2).
#include "hymoe/core/rng.h"

#include <cmath>

namespace hymoe {

namespace {

constexpr uint32_t philox_m0 = 0xD2511F53;  // round multipliers
constexpr uint32_t philox_m1 = 0xCD9E8D57;
constexpr uint32_t philox_w0 = 0x9E3779B9;  // key (Weyl) increments: golden ratio, sqrt(3) - 1
constexpr uint32_t philox_w1 = 0xBB67AE85;
constexpr float two_pi = 6.28318530717958647692f;
constexpr float inv_2p24 = 1.0f / 16777216.0f;  // 2^-24

// One round: two 32x32->64 products, their high halves xored with the other words and the key.
std::array<uint32_t, 4> philox_round(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k) {
    uint64_t p0 = uint64_t{philox_m0} * c[0];
    uint64_t p1 = uint64_t{philox_m1} * c[2];
    return {static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ k[0],
            static_cast<uint32_t>(p1),
            static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ k[1],
            static_cast<uint32_t>(p0)};
}

}  // namespace

std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> ctr, std::array<uint32_t, 2> key) {
    for (int r = 0; r < 10; ++r) {
        if (r > 0) {
            key[0] += philox_w0;
            key[1] += philox_w1;
        }
        ctr = philox_round(ctr, key);
    }
    return ctr;
}

Philox::Philox(uint64_t seed, uint32_t stream, uint32_t subkey)
    : key_{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)},
      stream_(stream),
      subkey_(subkey) {}

uint32_t Philox::next_u32() {
    uint64_t index = offset_ >> 2;
    if (index != cached_index_) {
        cached_ = philox4x32_10(
            {static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32), stream_, subkey_},
            key_);
        cached_index_ = index;
    }
    return cached_[offset_++ & 3];
}

float Philox::uniform() {
    return static_cast<float>(next_u32() >> 8) * inv_2p24;
}

float Philox::normal() {
    float u1 = static_cast<float>((next_u32() >> 8) + 1) * inv_2p24;  // (0, 1]: log is finite
    float u2 = uniform();
    return std::sqrt(-2.0f * std::log(u1)) * std::cos(two_pi * u2);
}

void Philox::fill_uniform(float* x, size_t n, float lo, float hi) {
    float scale = hi - lo;
    for (size_t i = 0; i < n; ++i)
        x[i] = lo + scale * uniform();
}

void Philox::fill_normal(float* x, size_t n, float mean, float std) {
    size_t i = 0;
    for (; i + 1 < n; i += 2) {
        float u1 = static_cast<float>((next_u32() >> 8) + 1) * inv_2p24;
        float u2 = uniform();
        float r = std::sqrt(-2.0f * std::log(u1));
        x[i] = mean + std * r * std::cos(two_pi * u2);
        x[i + 1] = mean + std * r * std::sin(two_pi * u2);
    }
    if (i < n)
        x[i] = mean + std * normal();
}

}  // namespace hymoe
