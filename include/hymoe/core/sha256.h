// SHA-256 (FIPS 180-4), incremental: update() any number of times, then digest() or hex_digest().
// Both are const (they finalise a copy), so a running hash can be read and then extended.
// Used for checkpoint and data manifests, not for security.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace hymoe {

class Sha256 {
public:
    Sha256();
    void update(const void* data, size_t n);
    void update(std::string_view s) { update(s.data(), s.size()); }
    std::array<uint8_t, 32> digest() const;
    std::string hex_digest() const;  // 64 lower-case hex digits

private:
    void compress(const uint8_t* block);             // one 64-byte block into state_
    void blocks(const uint8_t* data, size_t count);  // count whole blocks, hardware if it can

    std::array<uint32_t, 8> state_;
    std::array<uint8_t, 64> buffer_{};  // the pending partial block
    size_t buffered_ = 0;               // bytes in buffer_, < 64
    uint64_t total_ = 0;                // message length in bytes
};

std::string sha256_hex(std::string_view s);

// Whole blocks go through the x86 SHA extensions (SHA-NI) when the CPU has them (checked once at
// run time), else through the portable code; both give the same digests. Tests and benchmarks
// may switch the hardware path off (process-global; set before hashing).
bool sha256_hardware_in_use();
void sha256_use_hardware(bool on);

}  // namespace hymoe
