// ops::gemm_w, the products with 16-bit weights, against an fp64 reference on the widened
// weights, on every kernel path forced in turn (AVX-512-BF16 where the CPU has it, portable):
// the bound is fp32 accumulation alone, |err| ≤ 2k·2⁻²⁴·Σ|a·w| (+ the beta term). The AVX-512
// kernels (GEMV and GEMM) round the activations to bf16 first, so its reference uses those
// rounded activations (same bound), and it is checked to be within bf16 rounding (2⁻⁸ relative
// on Σ|a·w|) of the unrounded one. fp32 weights: the AVX-512 GEMV (m ≤ 4, W [n, k]) against the
// same reference and bound, every other fp32 product bit-identical to ops::gemm. The GEMVs give
// a row the same bits alone or among up to four rows, and any OpenMP thread count gives the
// same bits as one thread (GEMVs and the bf16 GEMM); the bf16 GEMV against a W [k, n] likewise
// gives a row the same bits alone or among up to four rows.
#include <cmath>
#include <cstring>
#include <omp.h>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "../../../src/backend/cpu/gemm_f32.h"
#include "../../../src/backend/cpu/weight_kernels.h"
#include "hymoe/backend/ops.h"
#include "hymoe/core/rng.h"

namespace ops = hymoe::ops;
using hymoe::DType;

namespace {

std::vector<float> normal(size_t n, uint32_t stream) {
    std::vector<float> x(n);
    hymoe::Philox(7, stream, 0).fill_normal(x.data(), n, 0.0f, 1.0f);
    return x;
}

uint16_t to16(float x, DType t) {
    return t == DType::bf16 ? hymoe::float_to_bf16(x) : hymoe::float_to_f16(x);
}
float from16(uint16_t h, DType t) {
    return t == DType::bf16 ? hymoe::bf16_to_float(h) : hymoe::f16_to_float(h);
}

struct Case {
    bool trans_w;
    int64_t m, n, k;
    float alpha, beta;
};

// Runs gemm_w on a weight of dtype t (fp32 or 16-bit) and checks every element against fp64 sums;
// returns the largest error relative to its bound (≤ 1 passes).
double check(const Case& c, DType t, bool rounded_activations) {
    const int64_t lda = c.k + 3, ldc = c.n + 2;
    const int64_t w_rows = c.trans_w ? c.n : c.k, w_cols = c.trans_w ? c.k : c.n, ldw = w_cols + 1;
    std::vector<float> a = normal(static_cast<size_t>(c.m * lda), 1);
    std::vector<float> wf = normal(static_cast<size_t>(w_rows * ldw), 2);
    std::vector<uint16_t> w(wf.size());
    for (size_t i = 0; i < w.size(); ++i)
        w[i] = t == DType::f32 ? 0 : to16(wf[i], t);
    auto weight = [&](size_t i) { return t == DType::f32 ? wf[i] : from16(w[i], t); };
    const std::vector<float> c0 = normal(static_cast<size_t>(c.m * ldc), 3);
    std::vector<float> out = c0;
    ops::gemm_w(c.trans_w,
                c.m,
                c.n,
                c.k,
                c.alpha,
                a.data(),
                lda,
                {t == DType::f32 ? static_cast<const void*>(wf.data()) : w.data(), t},
                ldw,
                c.beta,
                out.data(),
                ldc);
    double worst = 0;
    const double u = std::ldexp(1.0, -24), alpha = c.alpha, beta = c.beta;
    for (int64_t i = 0; i < c.m; ++i)
        for (int64_t j = 0; j < c.n; ++j) {
            double ref = 0, ref_exact = 0, mag = 0;
            for (int64_t p = 0; p < c.k; ++p) {
                const float ap = a[static_cast<size_t>(i * lda + p)];
                const double av =
                    rounded_activations ? hymoe::bf16_to_float(hymoe::float_to_bf16(ap)) : ap;
                const double wv =
                    weight(static_cast<size_t>(c.trans_w ? j * ldw + p : p * ldw + j));
                ref += av * wv, ref_exact += double{ap} * wv, mag += std::abs(av * wv);
            }
            const double cin = c0[static_cast<size_t>(i * ldc + j)];
            const double want = alpha * ref + beta * cin;
            const double got = out[static_cast<size_t>(i * ldc + j)];
            const double bound = 2.0 * static_cast<double>(c.k + 2) * u *
                                     (std::abs(alpha) * mag + std::abs(beta * cin)) +
                                 1e-30;
            worst = std::max(worst, std::abs(got - want) / bound);
            if (rounded_activations)  // and near the unrounded product: bf16 rounding of a
                BOOST_TEST(std::abs(got - (alpha * ref_exact + beta * cin)) <=
                           std::ldexp(1.0, -8) * std::abs(alpha) * mag + bound);
        }
    // padding between rows of C is left alone
    for (int64_t i = 0; i < c.m; ++i)
        for (int64_t j = c.n; j < ldc; ++j)
            BOOST_TEST(out[static_cast<size_t>(i * ldc + j)] ==
                       c0[static_cast<size_t>(i * ldc + j)]);
    return worst;
}

std::vector<Case> cases() {
    std::vector<Case> all;
    for (bool tw : {true, false})
        for (int64_t m : {1, 2, 3, 4, 5, 6, 7, 13})
            for (int64_t n : {1, 5, 17, 64, 65, 130})
                for (int64_t k : {1, 2, 15, 16, 17, 33, 100, 257})
                    all.push_back({tw, m, n, k, m % 2 ? 1.0f : 0.75f, n % 2 ? 0.0f : 0.5f});
    return all;
}

// Runs `body` with the weight kernel forced to k, then back to automatic.
template <typename F>
void with_kernel(ops::WeightKernel k, F body) {
    ops::set_weight_kernel(k);
    body();
    ops::set_weight_kernel(ops::WeightKernel::automatic);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(weight_gemm)

BOOST_AUTO_TEST_CASE(bf16_avx512_kernels_match_fp64_within_fp32_accumulation) {
    ops::set_weight_kernel(ops::WeightKernel::automatic);
    if (ops::weight_kernel() != ops::WeightKernel::avx512_bf16) {
        BOOST_TEST_MESSAGE("skipped: this CPU has no avx512_bf16");
        return;
    }
    with_kernel(ops::WeightKernel::avx512_bf16, [] {
        double worst = 0;
        for (const Case& c : cases()) {
            // both AVX-512 kernels for y = x Wᵀ round the activations; for x W (dx = dy·W and the
            // absorbed MLA query) the m ≤ 4 GEMV widens W and keeps x fp32, m > 4 is portable
            worst = std::max(worst, check(c, DType::bf16, c.trans_w));
        }
        BOOST_TEST_MESSAGE("avx512 bf16: worst error / bound " << worst);
        BOOST_TEST(worst <= 1.0);
    });
}

BOOST_AUTO_TEST_CASE(portable_path_matches_fp64_for_bf16_and_fp16) {
    with_kernel(ops::WeightKernel::portable, [] {
        for (DType t : {DType::bf16, DType::f16}) {
            double worst = 0;
            for (const Case& c : cases())
                worst = std::max(worst, check(c, t, false));
            BOOST_TEST_MESSAGE(hymoe::to_string(t) << " portable: worst error / bound " << worst);
            BOOST_TEST(worst <= 1.0);
        }
    });
}

BOOST_AUTO_TEST_CASE(batch_invariant_rows_do_not_depend_on_the_call) {
    // with inference.batch_invariant, a row's bf16 product is the same alone or among 13 rows
    ops::set_batch_invariant(true);
    const int64_t m = 13, n = 70, k = 129;
    std::vector<float> a = normal(static_cast<size_t>(m * k), 4),
                       wf = normal(static_cast<size_t>(n * k), 5);
    std::vector<uint16_t> w(wf.size());
    for (size_t i = 0; i < w.size(); ++i)
        w[i] = hymoe::float_to_bf16(wf[i]);
    std::vector<float> all(static_cast<size_t>(m * n)), one(static_cast<size_t>(n));
    ops::gemm_w(true, m, n, k, 1.0f, a.data(), k, {w.data(), DType::bf16}, k, 0.0f, all.data(), n);
    for (int64_t i = 0; i < m; ++i) {
        ops::gemm_w(true,
                    1,
                    n,
                    k,
                    1.0f,
                    a.data() + i * k,
                    k,
                    {w.data(), DType::bf16},
                    k,
                    0.0f,
                    one.data(),
                    n);
        BOOST_TEST(std::memcmp(one.data(), all.data() + i * n, static_cast<size_t>(n) * 4) == 0);
    }
    ops::set_batch_invariant(false);
}

BOOST_AUTO_TEST_CASE(fp32_gemv_matches_fp64_within_fp32_accumulation) {
    double worst = 0;
    for (const Case& c : cases())
        if (c.trans_w && c.m <= 4)
            worst = std::max(worst, check(c, DType::f32, false));
    BOOST_TEST_MESSAGE("fp32 GEMV: worst error / bound " << worst);
    BOOST_TEST(worst <= 1.0);
}

BOOST_AUTO_TEST_CASE(other_fp32_products_are_exactly_ops_gemm) {
    for (bool invariant : {false, true})
        for (bool tw : {true, false})
            for (int64_t m : {1, 3, 9}) {
                if (tw && m <= 4 && !invariant)
                    continue;  // the GEMV's
                ops::set_batch_invariant(invariant);
                const int64_t n = 37, k = 45;
                std::vector<float> a = normal(static_cast<size_t>(m * k), 6),
                                   w = normal(static_cast<size_t>(n * k), 7);
                std::vector<float> c1 = normal(static_cast<size_t>(m * n), 8), c2 = c1;
                ops::gemm(false,
                          tw,
                          m,
                          n,
                          k,
                          0.5f,
                          a.data(),
                          k,
                          w.data(),
                          tw ? k : n,
                          0.25f,
                          c1.data(),
                          n);
                ops::gemm_w(tw,
                            m,
                            n,
                            k,
                            0.5f,
                            a.data(),
                            k,
                            {w.data(), DType::f32},
                            tw ? k : n,
                            0.25f,
                            c2.data(),
                            n);
                BOOST_TEST(std::memcmp(c1.data(), c2.data(), c1.size() * 4) == 0);
                ops::set_batch_invariant(false);
            }
}

// y [m, n] = a [m, k] · wᵀ through gemm_w, W [n, k] held at dtype t (made from wf).
std::vector<float> product(DType t,
                           int64_t m,
                           int64_t n,
                           int64_t k,
                           const std::vector<float>& a,
                           const std::vector<float>& wf) {
    std::vector<uint16_t> w16(wf.size());
    for (size_t i = 0; i < wf.size(); ++i)
        w16[i] = hymoe::float_to_bf16(wf[i]);
    const void* w = t == DType::f32 ? static_cast<const void*>(wf.data()) : w16.data();
    std::vector<float> y(static_cast<size_t>(m * n));
    ops::gemm_w(true, m, n, k, 1.0f, a.data(), k, {w, t}, k, 0.0f, y.data(), n);
    return y;
}

BOOST_AUTO_TEST_CASE(gemv_rows_do_not_depend_on_the_batch) {
    // decode: a row's GEMV result is the same bits alone or as any of 2-4 rows
    std::vector<DType> types{DType::f32};
    if (ops::weight_kernel() == ops::WeightKernel::avx512_bf16)
        types.push_back(DType::bf16);
    const int64_t n = 83, k = 301;  // odd sizes: k not a multiple of 32, nor 64, nor 128
    const std::vector<float> a = normal(static_cast<size_t>(4 * k), 9),
                             wf = normal(static_cast<size_t>(n * k), 10);
    for (DType t : types)
        for (int64_t m = 2; m <= 4; ++m) {
            const std::vector<float> all = product(t, m, n, k, a, wf);
            for (int64_t i = 0; i < m; ++i) {
                const std::vector<float> row(a.begin() + i * k, a.begin() + (i + 1) * k);
                const std::vector<float> one = product(t, 1, n, k, row, wf);
                BOOST_TEST(std::memcmp(one.data(), all.data() + i * n, one.size() * 4) == 0,
                           hymoe::to_string(t) << " row " << i << " of " << m);
            }
        }
}

BOOST_AUTO_TEST_CASE(bf16_gemv_n_rows_do_not_depend_on_the_batch) {
    // y = a · W for a bf16 W [k, n] (not transposed): a row is the same bits alone or among 2-4
    if (ops::weight_kernel() != ops::WeightKernel::avx512_bf16) {
        BOOST_TEST_MESSAGE("skipped: this CPU has no avx512_bf16");
        return;
    }
    const int64_t n = 83, k = 301;
    const std::vector<float> a = normal(static_cast<size_t>(4 * k), 13),
                             wf = normal(static_cast<size_t>(k * n), 14);
    std::vector<uint16_t> w(wf.size());
    for (size_t i = 0; i < w.size(); ++i)
        w[i] = hymoe::float_to_bf16(wf[i]);
    auto product_n = [&](int64_t m, const float* x) {
        std::vector<float> y(static_cast<size_t>(m * n));
        ops::gemm_w(false, m, n, k, 1.0f, x, k, {w.data(), DType::bf16}, n, 0.0f, y.data(), n);
        return y;
    };
    for (int64_t m = 2; m <= 4; ++m) {
        const std::vector<float> all = product_n(m, a.data());
        for (int64_t i = 0; i < m; ++i) {
            const std::vector<float> one = product_n(1, a.data() + i * k);
            BOOST_TEST(std::memcmp(one.data(), all.data() + i * n, one.size() * 4) == 0,
                       "row " << i << " of " << m);
        }
    }
}

BOOST_AUTO_TEST_CASE(threads_give_the_one_thread_bits) {
    // OpenMP threads split the weight rows (GEMV) or panels (fp32 and bf16 GEMMs), never k: 2
    // and 3 threads equal 1 bit for bit, on products large enough to be split (fp32 GEMMs on a
    // CPU without AVX-512 are OpenBLAS's sgemm, whose threaded results may differ in the last
    // bit: not checked there)
    std::vector<DType> types{DType::f32};
    if (ops::weight_kernel() == ops::WeightKernel::avx512_bf16)
        types.push_back(DType::bf16);
    const int64_t n = 419, k = 1001;
    const std::vector<float> a = normal(static_cast<size_t>(13 * k), 11),
                             wf = normal(static_cast<size_t>(n * k), 12);
    const int saved = omp_get_max_threads();
    for (DType t : types)
        for (int64_t m : {1, 3, 4, 13}) {
            if (t == DType::f32 && m > 4 && !ops::detail::f32_avx512_on())
                continue;
            omp_set_num_threads(1);
            const std::vector<float> one = product(t, m, n, k, a, wf);
            for (int threads : {2, 3}) {
                omp_set_num_threads(threads);
                const std::vector<float> many = product(t, m, n, k, a, wf);
                BOOST_TEST(std::memcmp(one.data(), many.data(), one.size() * 4) == 0,
                           hymoe::to_string(t) << " m " << m << ", " << threads << " threads");
            }
        }
    omp_set_num_threads(saved);
}

BOOST_AUTO_TEST_CASE(vector_bf16_rounding_is_float_to_bf16) {
    // the kernels' activation rounding, 16 lanes at a time with a masked tail, against the scalar
    // float_to_bf16 bit for bit: ties both ways, NaNs (signalling too), infinities, overflow to
    // infinity, denormals, signed zeros, random values; every length 1-40
    if (!hymoe::ops::detail::cpu_has_avx512()) {
        BOOST_TEST_MESSAGE("skipped: this CPU has no AVX-512");
        return;
    }
    std::vector<uint32_t> bits{0x00000000u,
                               0x80000000u,
                               0x3f808000u,
                               0x3f818000u,
                               0x3f807fffu,
                               0x7f800000u,
                               0xff800000u,
                               0x7f800001u,
                               0x7fc00000u,
                               0xffff0001u,
                               0x7f7fffffu,
                               0x00000001u,
                               0x807fffffu,
                               0x00008000u,
                               0x00018000u};
    const std::vector<float> random = normal(200, 13);
    for (float x : random) {
        uint32_t u;
        std::memcpy(&u, &x, 4);
        bits.push_back(u);
    }
    std::vector<float> src(bits.size());
    std::memcpy(src.data(), bits.data(), bits.size() * 4);
    for (size_t n = 1; n <= 40; ++n) {
        std::vector<uint16_t> got(n + 1, 0xabcd);
        hymoe::ops::detail::round_to_bf16(src.data(), static_cast<int64_t>(n), got.data());
        for (size_t i = 0; i < n; ++i)
            BOOST_TEST(got[i] == hymoe::float_to_bf16(src[i]), "n " << n << " i " << i);
        BOOST_TEST(got[n] == 0xabcd);  // nothing written past n
    }
    std::vector<uint16_t> all(src.size());
    hymoe::ops::detail::round_to_bf16(src.data(), static_cast<int64_t>(src.size()), all.data());
    for (size_t i = 0; i < src.size(); ++i)
        BOOST_TEST(all[i] == hymoe::float_to_bf16(src[i]));
}

BOOST_AUTO_TEST_SUITE_END()
