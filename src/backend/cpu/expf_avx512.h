// e^x of fp32 arrays, sixteen lanes at a time by AVX-512, giving glibc's expf (the FMA variant
// x86-64 CPUs with AVX-512 run) bit for bit: its algorithm (ARM optimized-routines' expf, MIT) in
// double lanes, with the same fused multiply-adds and the same tables. Blocks holding |x| ≥ 88,
// inf or NaN go to std::exp. Checked against std::exp on every fp32 input (test_expf_avx512.cpp).
#pragma once

#include <cstdint>

namespace hymoe::ops::detail {

// y[i] = std::exp(negate ? −x[i] : x[i]) for n elements (y may alias x). Runs the AVX-512 lanes
// when the CPU has avx512f and libm's expf is the FMA variant's algorithm (glibc ≥ 2.28 on x86-64),
// std::exp otherwise.
void expf_array(const float* x, bool negate, float* y, int64_t n);

// Whether expf_array runs the vector lanes here.
bool expf_vector();

}  // namespace hymoe::ops::detail
