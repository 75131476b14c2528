// The SHA-256 block function on the x86 SHA extensions (SHA-NI: sha256rnds2, sha256msg1/2), for
// core/sha256.cpp. Compiled for those instructions through a target attribute and called only
// after a runtime check, so the binary still runs on CPUs without them. State layout of the
// instructions: two vectors ABEF and CDGH (lane 3 first), converted from and to state[8] around
// the blocks. Each 4-round group adds K to its 4 message words and runs two sha256rnds2; the
// message schedule is W_i = msg2(msg1(W_{i−4}, W_{i−3}) + alignr(W_{i−1}, W_{i−2}, 4), W_{i−1}).
#include <cstddef>
#include <cstdint>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace hymoe::detail {

#if defined(__x86_64__)

// CPUID leaf 7 EBX bit 29 (SHA) and leaf 1 ECX bit 19 (SSE4.1); read directly, as clang 14's
// __builtin_cpu_supports does not know "sha".
bool sha256_hardware() {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 19)))
        return false;
    return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (b & (1u << 29));
}

__attribute__((target("sha,sse4.1,ssse3"))) void sha256_blocks_hw(uint32_t* state,
                                                                  const uint32_t* k,
                                                                  const uint8_t* data,
                                                                  size_t blocks) {
    const __m128i bswap = _mm_set_epi64x(0x0c0d0e0f08090a0bLL, 0x0405060700010203LL);
    __m128i t = _mm_shuffle_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(state)), 0xB1);
    __m128i s1 =
        _mm_shuffle_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(state + 4)), 0x1B);
    __m128i s0 = _mm_alignr_epi8(t, s1, 8);  // ABEF
    s1 = _mm_blend_epi16(s1, t, 0xF0);       // CDGH
    for (; blocks > 0; --blocks, data += 64) {
        const __m128i abef = s0, cdgh = s1;
        __m128i w[4];
        for (int i = 0; i < 16; ++i) {
            __m128i& cur = w[i % 4];
            if (i < 4) {
                cur = _mm_shuffle_epi8(
                    _mm_loadu_si128(reinterpret_cast<const __m128i*>(data + 16 * i)), bswap);
            } else {
                const __m128i add = _mm_alignr_epi8(w[(i - 1) % 4], w[(i - 2) % 4], 4);
                cur = _mm_sha256msg2_epu32(
                    _mm_add_epi32(_mm_sha256msg1_epu32(cur, w[(i - 3) % 4]), add), w[(i - 1) % 4]);
            }
            __m128i msg =
                _mm_add_epi32(cur, _mm_loadu_si128(reinterpret_cast<const __m128i*>(k + 4 * i)));
            s1 = _mm_sha256rnds2_epu32(s1, s0, msg);
            msg = _mm_shuffle_epi32(msg, 0x0E);
            s0 = _mm_sha256rnds2_epu32(s0, s1, msg);
        }
        s0 = _mm_add_epi32(s0, abef);
        s1 = _mm_add_epi32(s1, cdgh);
    }
    t = _mm_shuffle_epi32(s0, 0x1B);                                                     // FEBA
    s1 = _mm_shuffle_epi32(s1, 0xB1);                                                    // DCHG
    _mm_storeu_si128(reinterpret_cast<__m128i*>(state), _mm_blend_epi16(t, s1, 0xF0));   // DCBA
    _mm_storeu_si128(reinterpret_cast<__m128i*>(state + 4), _mm_alignr_epi8(s1, t, 8));  // HGFE
}

#else

bool sha256_hardware() {
    return false;
}

void sha256_blocks_hw(uint32_t*, const uint32_t*, const uint8_t*, size_t) {}

#endif

}  // namespace hymoe::detail
