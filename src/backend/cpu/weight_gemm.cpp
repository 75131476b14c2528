// ops::gemm_w (backend/ops.h): products with weights at their storage dtype, and the choice of
// kernels (set_weight_kernel). fp32 goes to the AVX-512 GEMV (gemv_avx512.cpp) for m ≤ 4 rows of
// a W [n, k] on an AVX-512 CPU (unless the portable kernels are forced), else to ops::gemm (which
// runs hymoe's AVX-512 GEMM or OpenBLAS); bf16 to the AVX-512-BF16 kernels (GEMV for m ≤ 4, GEMM
// of linear_bf16.cpp; m ≤ 4 rows against a W [k, n] by a GEMV that widens W in registers) when
// the CPU has avx512_bf16, and everything else to the portable path here (widen a block of the
// weight to fp32, ops::gemm). Batch-invariant runs skip the GEMVs (ops::gemm keeps rows
// independent, the bf16 GEMM's rows do not depend on each other).
#include <algorithm>
#include <vector>

#include "gemm_f32.h"
#include "hymoe/backend/ops.h"
#include "hymoe/core/error.h"
#include "hymoe/core/timer.h"
#include "weight_kernels.h"

namespace hymoe::ops {

namespace {

WeightKernel chosen = WeightKernel::automatic;

bool float_dtype(DType t) {
    return t == DType::f32 || t == DType::bf16 || t == DType::f16;
}

float widen(uint16_t h, DType t) {
    return t == DType::bf16 ? bf16_to_float(h) : f16_to_float(h);
}

// dst [rows, cols] = the fp32 values of the 16-bit w [rows, cols] (row stride ldw).
void widen_block(const uint16_t* w, int64_t ldw, DType t, int64_t rows, int64_t cols, float* dst) {
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < cols; ++j)
            dst[r * cols + j] = widen(w[r * ldw + j], t);
}

// The portable 16-bit path: the weight widened to fp32, blocks of 256 rows at a time when W is
// [n, k] (each block one sgemm on its columns of C), whole when it is [k, n].
void gemm_widened(bool trans_w,
                  int64_t m,
                  int64_t n,
                  int64_t k,
                  float alpha,
                  const float* a,
                  int64_t lda,
                  WeightRef w,
                  int64_t ldw,
                  float beta,
                  float* c,
                  int64_t ldc) {
    const auto* w16 = static_cast<const uint16_t*>(w.data);
    if (!trans_w) {
        std::vector<float> wf(static_cast<size_t>(k * n));  // [k, n]
        widen_block(w16, ldw, w.dtype, k, n, wf.data());
        gemm(false, false, m, n, k, alpha, a, lda, wf.data(), n, beta, c, ldc);
        return;
    }
    constexpr int64_t block = 256;
    std::vector<float> wf(static_cast<size_t>(std::min(n, block) * k));  // [block, k]
    for (int64_t j = 0; j < n; j += block) {
        const int64_t nb = std::min(block, n - j);
        widen_block(w16 + j * ldw, ldw, w.dtype, nb, k, wf.data());
        gemm(false, true, m, nb, k, alpha, a, lda, wf.data(), k, beta, c + j, ldc);
    }
}

// ops::gemm_counter += one product of m·n·k started at t0.
void count_gemm(int64_t m, int64_t n, int64_t k, double t0) {
    GemmCounter& counter = gemm_counter();
    counter.seconds += wall_seconds() - t0;
    counter.flops += 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
}

}  // namespace

WeightRef WeightRef::at(int64_t offset) const {
    return {static_cast<const char*>(data) + offset * static_cast<int64_t>(dtype_size(dtype)),
            dtype};
}

WeightRef weight_ref(const Tensor& w) {
    HYMOE_CHECK(float_dtype(w.dtype) && w.device == Device::cpu,
                "weight product: expected a float host weight, got ",
                to_string(w.dtype),
                " on ",
                to_string(w.device));
    return {w.data, w.dtype};
}

const char* to_string(WeightKernel k) {
    switch (k) {
        case WeightKernel::automatic:
            return "automatic";
        case WeightKernel::avx512_bf16:
            return "AVX-512 (fp32: hymoe GEMM and GEMV; bf16 weights: streamed GEMV, VDPBF16PS "
                   "GEMM)";
        case WeightKernel::avx512:
            return "AVX-512 (fp32: hymoe GEMM and GEMV; 16-bit weights widened to fp32)";
        case WeightKernel::portable:
            return "portable (OpenBLAS sgemm; 16-bit weights widened to fp32)";
    }
    return "?";
}

void set_weight_kernel(WeightKernel k) {
    HYMOE_CHECK(k != WeightKernel::avx512_bf16 || detail::cpu_has_avx512_bf16(),
                "weight kernels: this CPU has no avx512_bf16");
    HYMOE_CHECK(k != WeightKernel::avx512 || detail::cpu_has_avx512(),
                "weight kernels: this CPU has no avx512f/bw/vl");
    chosen = k;
}

WeightKernel weight_kernel() {
    if (chosen == WeightKernel::automatic)
        chosen = detail::cpu_has_avx512_bf16() ? WeightKernel::avx512_bf16
                 : detail::cpu_has_avx512()    ? WeightKernel::avx512
                                               : WeightKernel::portable;
    return chosen;
}

bool detail::f32_avx512_on() {
    return weight_kernel() != WeightKernel::portable;
}

void gemm_w(bool trans_w,
            int64_t m,
            int64_t n,
            int64_t k,
            float alpha,
            const float* a,
            int64_t lda,
            WeightRef w,
            int64_t ldw,
            float beta,
            float* c,
            int64_t ldc) {
    const bool gemv = trans_w && m <= 4 && !detail::batch_invariant_on();
    if (w.dtype == DType::f32) {
        if (!gemv || !detail::f32_avx512_on() || m == 0 || n == 0)
            return gemm(false,
                        trans_w,
                        m,
                        n,
                        k,
                        alpha,
                        a,
                        lda,
                        static_cast<const float*>(w.data),
                        ldw,
                        beta,
                        c,
                        ldc);
        const double t0 = wall_seconds();
        detail::f32_gemv_avx512(
            m, n, k, alpha, a, lda, static_cast<const float*>(w.data), ldw, beta, c, ldc);
        count_gemm(m, n, k, t0);
        return;
    }
    HYMOE_CHECK(w.dtype == DType::bf16 || w.dtype == DType::f16,
                "gemm_w: a ",
                to_string(w.dtype),
                " weight");
    if (m == 0 || n == 0)
        return;
    const bool gemv_n = !trans_w && m <= 4 && !detail::batch_invariant_on();
    if (w.dtype != DType::bf16 || (!trans_w && !gemv_n) ||
        weight_kernel() != WeightKernel::avx512_bf16)
        return gemm_widened(trans_w, m, n, k, alpha, a, lda, w, ldw, beta, c, ldc);
    const double t0 = wall_seconds();
    const auto* w16 = static_cast<const uint16_t*>(w.data);
    if (gemv_n)
        detail::bf16_gemv_n_avx512(m, n, k, alpha, a, lda, w16, ldw, beta, c, ldc);
    else if (gemv)
        detail::bf16_gemv_avx512(m, n, k, alpha, a, lda, w16, ldw, beta, c, ldc);
    else
        detail::bf16_gemm_avx512(m, n, k, alpha, a, lda, w16, ldw, beta, c, ldc);
    count_gemm(m, n, k, t0);
}

}  // namespace hymoe::ops
