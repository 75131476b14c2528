// Philox4x32-10, the counter-based RNG of Salmon et al. 2011 (Random123). A draw is a pure function
// of (seed, stream, subkey, offset): key = the 64-bit seed (lo, hi); counter = (offset/4 lo,
// offset/4 hi, stream, subkey), and each 128-bit block gives 4 u32 draws. So any rank can draw its
// own slice without talking to the others (subkey = rank or global index), and the whole state is
// the offset: offset() after n draws is n, and seek(offset()) restores the stream exactly.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace hymoe {

// One Philox4x32-10 block: 10 rounds of the multiply-xor round with the Weyl key schedule.
std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> ctr, std::array<uint32_t, 2> key);

struct Philox {
    Philox(uint64_t seed, uint32_t stream, uint32_t subkey);

    uint32_t next_u32();  // consumes 1 draw
    float uniform();      // [0, 1) on a 2^-24 grid; consumes 1 draw
    float normal();       // N(0, 1) by Box-Muller (cosine half); consumes 2 draws
    // x[i] = lo + (hi - lo) * uniform(); consumes n draws.
    void fill_uniform(float* x, size_t n, float lo, float hi);
    // x[i] = mean + std * N(0, 1), both Box-Muller halves used per pair of outputs (an odd tail
    // uses the cosine half); consumes 2 * ceil(n / 2) draws.
    void fill_normal(float* x, size_t n, float mean, float std);

    uint64_t offset() const { return offset_; }  // draws consumed so far: the checkpointed state
    void seek(uint64_t offset) { offset_ = offset; }

private:
    std::array<uint32_t, 2> key_;
    uint32_t stream_;
    uint32_t subkey_;
    uint64_t offset_ = 0;
    uint64_t cached_index_ = UINT64_MAX;  // block index of cached_ (offset / 4 < 2^62: never MAX)
    std::array<uint32_t, 4> cached_{};
};

}  // namespace hymoe
