// cuBLAS products against the CPU ones (ops::gemm, ops::linear) on random inputs, by normalised
// error: every transpose in fp32, linear with beta = 0 and 1 and a one-row input, bf16 inputs
// into bf16 and fp32 outputs, and the grouped expert GEMM (experts with zero rows included)
// against one ops::linear per expert.
#include <cstdint>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "cuda_test.h"
#include "hymoe/backend/cuda_gemm.h"
#include "hymoe/backend/ops.h"

namespace utf = boost::unit_test;
using namespace hymoe;
using namespace hymoe::cuda_test;

BOOST_AUTO_TEST_SUITE(cuda_gemm, *utf::label("cuda"))

BOOST_AUTO_TEST_CASE(gemm_every_transpose_fp32, *utf::precondition(need_gpu)) {
    Gpu g;
    cu::Blas blas(g.s, g.arena);
    const int64_t m = 37, n = 53, k = 71;
    for (bool ta : {false, true}) {
        for (bool tb : {false, true}) {
            Buffer a = random({ta ? k : m, ta ? m : k}, 1, DType::f32);
            Buffer b = random({tb ? n : k, tb ? k : n}, 2, DType::f32);
            Buffer c = random({m, n}, 3, DType::f32);
            Tensor da = to_device(a.view(), DType::f32, g.arena, g.s);
            Tensor db = to_device(b.view(), DType::f32, g.arena, g.s);
            Tensor dc = to_device(c.view(), DType::f32, g.arena, g.s);
            const int64_t lda = a.view().dim(1), ldb = b.view().dim(1);
            ops::gemm(ta,
                      tb,
                      m,
                      n,
                      k,
                      0.5f,
                      a.ptr<float>(),
                      lda,
                      b.ptr<float>(),
                      ldb,
                      2.0f,
                      c.ptr<float>(),
                      n);
            blas.gemm(DType::f32,
                      DType::f32,
                      ta,
                      tb,
                      m,
                      n,
                      k,
                      0.5f,
                      da.data,
                      lda,
                      db.data,
                      ldb,
                      2.0f,
                      dc.data,
                      n);
            Buffer got = to_host(dc, g.s);
            const double err = rel_error(got.ptr<float>(), c.ptr<float>(), m * n);
            BOOST_TEST_INFO("trans_a " << ta << " trans_b " << tb);
            BOOST_TEST(err < tolerance(DType::f32));
        }
    }
}

BOOST_AUTO_TEST_CASE(linear_fp32_and_bf16, *utf::precondition(need_gpu)) {
    Gpu g;
    cu::Blas blas(g.s, g.arena);
    for (DType in : {DType::f32, DType::bf16}) {
        for (DType out : {DType::f32, DType::bf16}) {
            if (in == DType::f32 && out == DType::bf16)
                continue;
            for (int64_t rows : {int64_t{1}, int64_t{129}}) {
                for (float beta : {0.0f, 1.0f}) {
                    const int64_t d_in = 384, d_out = 200;
                    Buffer x = random({rows, d_in}, 4, in);
                    Buffer w = random({d_out, d_in}, 5, in, 0.05f);
                    Buffer y = random({rows, d_out}, 6, out);
                    Tensor dx = to_device(x.view(), in, g.arena, g.s);
                    Tensor dw = to_device(w.view(), in, g.arena, g.s);
                    Tensor dy = to_device(y.view(), out, g.arena, g.s);
                    ops::linear(x.view(), w.view(), y.view(), beta);
                    blas.linear(dx, dw, dy, beta);
                    Buffer got = to_host(dy, g.s);
                    const double err = rel_error(got.ptr<float>(), y.ptr<float>(), rows * d_out);
                    BOOST_TEST_INFO(to_string(in) << " -> " << to_string(out) << " rows " << rows
                                                  << " beta " << beta << " err " << err);
                    BOOST_TEST(err < tolerance(out == DType::bf16 ? out : in));
                }
            }
        }
    }
}

BOOST_AUTO_TEST_CASE(grouped_experts_match_one_linear_each, *utf::precondition(need_gpu)) {
    Gpu g;
    cu::Blas blas(g.s, g.arena);
    const std::vector<int64_t> rows = {5, 0, 17, 1, 0, 33, 8, 0};
    const int64_t E = static_cast<int64_t>(rows.size()), d_in = 96, d_out = 160;
    int64_t total = 0;
    for (int64_t r : rows)
        total += r;
    for (DType t : {DType::f32, DType::bf16}) {
        Buffer x = random({total, d_in}, 7, t);
        Buffer w = random({E, d_out, d_in}, 8, t, 0.1f);
        Buffer want(DType::f32, {total, d_out});
        int64_t off = 0;
        for (int64_t e = 0; e < E; ++e) {
            if (rows[e] > 0) {
                Tensor we{
                    w.ptr<float>() + e * d_out * d_in, DType::f32, Device::cpu, {d_out, d_in}};
                Tensor ye = want.view().rows(off, rows[e]);
                ops::linear(x.view().rows(off, rows[e]), we, ye);
            }
            off += rows[e];
        }
        Tensor dx = to_device(x.view(), t, g.arena, g.s);
        Tensor dw = to_device(w.view(), t, g.arena, g.s);
        Tensor dy = g.arena.tensor(t, {total, d_out});
        blas.grouped_linear(dx, dw, rows, dy);
        Buffer got = to_host(dy, g.s);
        const double err = rel_error(got.ptr<float>(), want.ptr<float>(), total * d_out);
        BOOST_TEST_INFO(to_string(t) << " err " << err);
        BOOST_TEST(err < tolerance(t));
    }
}

BOOST_AUTO_TEST_SUITE_END()
