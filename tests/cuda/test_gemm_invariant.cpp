// The batch-invariant GEMM (src/backend/cuda/gemm_invariant.h, Blas under ops::set_batch_invariant)
// on random inputs: every transpose in fp32 and bf16 inputs into both outputs against the CPU's
// products, by normalised error; a row's result bit for bit the same alone, in a call of 37 rows
// and in a slice starting at an odd row (other alignment); and the grouped expert GEMM bit for bit
// one product per expert.
#include <cstdint>
#include <cstring>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "cuda_test.h"
#include "hymoe/backend/cuda_gemm.h"
#include "hymoe/backend/ops.h"

namespace utf = boost::unit_test;
using namespace hymoe;
using namespace hymoe::cuda_test;

namespace {

// Batch invariance on for the scope (process-global, as the engine sets it).
struct Invariant {
    Invariant() { ops::set_batch_invariant(true); }
    ~Invariant() { ops::set_batch_invariant(false); }
    Invariant(const Invariant&) = delete;
    Invariant& operator=(const Invariant&) = delete;
};

// Row r of a host [rows, n] f32 buffer equals row q of another, bit for bit.
bool same_row(const Buffer& a, int64_t r, const Buffer& b, int64_t q, int64_t n) {
    return std::memcmp(a.ptr<float>() + r * n, b.ptr<float>() + q * n, n * sizeof(float)) == 0;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(cuda_gemm_invariant, *utf::label("cuda"))

BOOST_AUTO_TEST_CASE(every_transpose_matches_the_cpu, *utf::precondition(need_gpu)) {
    const Invariant on;
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
            BOOST_TEST_INFO("trans_a " << ta << " trans_b " << tb << " err " << err);
            BOOST_TEST(err < tolerance(DType::f32));
        }
    }
}

BOOST_AUTO_TEST_CASE(linear_fp32_and_bf16_match_the_cpu, *utf::precondition(need_gpu)) {
    const Invariant on;
    Gpu g;
    cu::Blas blas(g.s, g.arena);
    for (DType in : {DType::f32, DType::bf16}) {
        for (DType out : {DType::f32, DType::bf16}) {
            if (in == DType::f32 && out == DType::bf16)
                continue;
            for (float beta : {0.0f, 1.0f}) {
                const int64_t rows = 29, d_in = 384, d_out = 200;
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
                BOOST_TEST_INFO(to_string(in)
                                << " -> " << to_string(out) << " beta " << beta << " err " << err);
                BOOST_TEST(err < tolerance(out == DType::bf16 ? out : in));
            }
        }
    }
}

BOOST_AUTO_TEST_CASE(a_row_does_not_depend_on_the_call, *utf::precondition(need_gpu)) {
    const Invariant on;
    Gpu g;
    cu::Blas blas(g.s, g.arena);
    const int64_t rows = 37, d_in = 389, d_out = 203;  // odd widths: rows at every alignment
    for (DType t : {DType::f32, DType::bf16}) {
        Buffer x = random({rows, d_in}, 7, t);
        Buffer w = random({d_out, d_in}, 8, t, 0.05f);
        Tensor dx = to_device(x.view(), t, g.arena, g.s);
        Tensor dw = to_device(w.view(), t, g.arena, g.s);
        Tensor all = g.arena.tensor(DType::f32, {rows, d_out});
        blas.linear(dx, dw, all);
        const Buffer want = to_host(all, g.s);
        for (int64_t r : {int64_t{0}, int64_t{5}, int64_t{36}}) {
            Tensor one = g.arena.tensor(DType::f32, {1, d_out});
            blas.linear(dx.rows(r, 1), dw, one);
            BOOST_TEST_INFO(to_string(t) << " row " << r << " alone");
            BOOST_TEST(same_row(to_host(one, g.s), 0, want, r, d_out));
        }
        Tensor some = g.arena.tensor(DType::f32, {7, d_out});
        blas.linear(dx.rows(3, 7), dw, some);  // rows 3..9, starting at an odd row
        const Buffer got = to_host(some, g.s);
        for (int64_t q = 0; q < 7; ++q) {
            BOOST_TEST_INFO(to_string(t) << " row " << 3 + q << " of a slice");
            BOOST_TEST(same_row(got, q, want, 3 + q, d_out));
        }
    }
}

BOOST_AUTO_TEST_CASE(grouped_experts_equal_one_product_each, *utf::precondition(need_gpu)) {
    const Invariant on;
    Gpu g;
    cu::Blas blas(g.s, g.arena);
    const std::vector<int64_t> rows = {5, 0, 17, 1, 0, 33, 8, 0};
    const int64_t E = static_cast<int64_t>(rows.size()), d_in = 96, d_out = 160;
    int64_t total = 0;
    for (int64_t r : rows)
        total += r;
    Buffer x = random({total, d_in}, 9, DType::f32);
    Buffer w = random({E, d_out, d_in}, 10, DType::f32, 0.1f);
    Tensor dx = to_device(x.view(), DType::f32, g.arena, g.s);
    Tensor dw = to_device(w.view(), DType::f32, g.arena, g.s);
    Tensor dy = g.arena.tensor(DType::f32, {total, d_out});
    blas.grouped_linear(dx, dw, rows, dy);
    const Buffer got = to_host(dy, g.s);
    int64_t off = 0;
    for (int64_t e = 0; e < E; ++e) {
        if (rows[e] > 0) {
            const Tensor we{static_cast<float*>(dw.data) + e * d_out * d_in,
                            DType::f32,
                            Device::cuda,
                            {d_out, d_in}};
            Tensor ye = g.arena.tensor(DType::f32, {rows[e], d_out});
            blas.linear(dx.rows(off, rows[e]), we, ye);
            const Buffer one = to_host(ye, g.s);
            for (int64_t q = 0; q < rows[e]; ++q) {
                BOOST_TEST_INFO("expert " << e << " row " << q);
                BOOST_TEST(same_row(got, off + q, one, q, d_out));
            }
        }
        off += rows[e];
    }
}

BOOST_AUTO_TEST_SUITE_END()
