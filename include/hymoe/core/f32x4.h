// f32x4: four lanes of fp32 as a GCC/Clang vector (SSE on x86-64 without extra flags, NEON on
// arm64), loaded and stored unaligned. Each lane's +, −, ×, ÷ rounds as the scalar operator does,
// so a loop over lanes gives the scalar loop's results bit for bit (no reassociation: a lane
// holds one element's whole chain of operations).
#pragma once

#include <cstring>

namespace hymoe {

using f32x4 = float __attribute__((vector_size(16)));

inline f32x4 load4(const float* p) {
    f32x4 v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

inline void store4(float* p, f32x4 v) {
    std::memcpy(p, &v, sizeof v);
}

}  // namespace hymoe
