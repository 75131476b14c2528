// SHA-256 (FIPS 180-4 section 6.2): 64-byte blocks, big-endian words, padding = 0x80, zeros, then
// the message length in bits as a big-endian u64 so the padded length is a multiple of 64.
#include "hymoe/core/sha256.h"

#include <algorithm>
#include <cstring>

namespace hymoe {

namespace detail {  // sha256_ni.cpp
bool sha256_hardware();
void sha256_blocks_hw(uint32_t* state, const uint32_t* k, const uint8_t* data, size_t blocks);
}  // namespace detail

namespace {

constexpr std::array<uint32_t, 64> sha256_k = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

constexpr uint32_t rotr(uint32_t x, int n) {
    return (x >> n) | (x << (32 - n));
}

bool& use_hardware() {
    static bool on = detail::sha256_hardware();
    return on;
}

}  // namespace

bool sha256_hardware_in_use() {
    return use_hardware();
}

void sha256_use_hardware(bool on) {
    use_hardware() = on && detail::sha256_hardware();
}

void Sha256::blocks(const uint8_t* data, size_t count) {
    if (use_hardware())
        return detail::sha256_blocks_hw(state_.data(), sha256_k.data(), data, count);
    for (size_t b = 0; b < count; ++b)
        compress(data + 64 * b);
}

Sha256::Sha256()
    : state_{0x6a09e667,
             0xbb67ae85,
             0x3c6ef372,
             0xa54ff53a,
             0x510e527f,
             0x9b05688c,
             0x1f83d9ab,
             0x5be0cd19} {}

void Sha256::compress(const uint8_t* block) {
    std::array<uint32_t, 64> w;  // message schedule
    for (int t = 0; t < 16; ++t)
        w[t] = uint32_t{block[4 * t]} << 24 | uint32_t{block[4 * t + 1]} << 16 |
               uint32_t{block[4 * t + 2]} << 8 | uint32_t{block[4 * t + 3]};
    for (int t = 16; t < 64; ++t) {
        uint32_t s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
        uint32_t s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
        w[t] = w[t - 16] + s0 + w[t - 7] + s1;
    }
    uint32_t a = state_[0], b = state_[1], c = state_[2], d = state_[3];
    uint32_t e = state_[4], f = state_[5], g = state_[6], h = state_[7];
    for (int t = 0; t < 64; ++t) {
        uint32_t t1 = h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) +
                      sha256_k[t] + w[t];
        uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        h = g;
        g = f;
        f = e;
        e = d + t1;
        d = c;
        c = b;
        b = a;
        a = t1 + t2;
    }
    state_[0] += a;
    state_[1] += b;
    state_[2] += c;
    state_[3] += d;
    state_[4] += e;
    state_[5] += f;
    state_[6] += g;
    state_[7] += h;
}

void Sha256::update(const void* data, size_t n) {
    const uint8_t* p = static_cast<const uint8_t*>(data);
    total_ += n;
    if (buffered_ > 0) {
        size_t take = std::min(n, size_t{64} - buffered_);
        std::memcpy(buffer_.data() + buffered_, p, take);
        buffered_ += take;
        p += take;
        n -= take;
        if (buffered_ < 64)
            return;
        blocks(buffer_.data(), 1);
        buffered_ = 0;
    }
    blocks(p, n / 64);
    p += n / 64 * 64;
    n %= 64;
    if (n > 0)
        std::memcpy(buffer_.data(), p, n);
    buffered_ = n;
}

std::array<uint8_t, 32> Sha256::digest() const {
    Sha256 s = *this;
    uint64_t bits = total_ * 8;
    // Pad to 56 mod 64 with 0x80 then zeros, then the 8 length bytes.
    std::array<uint8_t, 72> pad{};
    pad[0] = 0x80;
    size_t n_pad = (buffered_ < 56 ? 56 : 120) - buffered_;
    for (int i = 0; i < 8; ++i)
        pad[n_pad + i] = static_cast<uint8_t>(bits >> (56 - 8 * i));
    s.update(pad.data(), n_pad + 8);
    std::array<uint8_t, 32> out;
    for (int i = 0; i < 8; ++i)
        for (int j = 0; j < 4; ++j)
            out[4 * i + j] = static_cast<uint8_t>(s.state_[i] >> (24 - 8 * j));
    return out;
}

std::string Sha256::hex_digest() const {
    static constexpr char hex[] = "0123456789abcdef";
    std::string out;
    out.reserve(64);
    for (uint8_t byte : digest()) {
        out += hex[byte >> 4];
        out += hex[byte & 15];
    }
    return out;
}

std::string sha256_hex(std::string_view s) {
    Sha256 h;
    h.update(s);
    return h.hex_digest();
}

}  // namespace hymoe
