// The router's score backward and the cross-entropy rows (hymoe/backend/ops_router_loss.h) on a
// CUDA context against the same ops on the CPU context, fp32: the router under sigmoid and
// softmax scoring, renormalised with a bias or not; the cross-entropy's losses and argmaxes (a
// tie to the first maximum) and its gradient over 300 rows of a 1000-entry vocabulary; and the
// loss head's row moves (backend/ops_rows.h) and the gradient norm's sum of squares
// (backend/ops_reduce.h). The CPU forms are
// tests/unit/backend/test_router_loss_ops.cpp's and test_rows_ops.cpp's.
#include <cmath>
#include <cstdint>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "cuda_test.h"
#include "hymoe/backend/cuda_gemm.h"
#include "hymoe/backend/ops_reduce.h"
#include "hymoe/backend/ops_router_loss.h"
#include "hymoe/backend/ops_rows.h"

namespace utf = boost::unit_test;
using namespace hymoe;
using namespace hymoe::cuda_test;

BOOST_AUTO_TEST_SUITE(cuda_router_loss_ops, *utf::label("cuda"))

BOOST_AUTO_TEST_CASE(router_and_cross_entropy, *utf::precondition(need_gpu)) {
    GpuCtx gc;
    const backend::Ctx cpu = backend::cpu_ctx();
    const DType f = DType::f32;
    const int64_t n = 37, E = 16, k = 4;
    Buffer s = random({n, E}, 1, f);
    for (int64_t i = 0; i < n * E; ++i)
        s.ptr<float>()[i] = 1.0f / (1.0f + std::exp(-s.ptr<float>()[i]));
    const Buffer dw = random({n, k}, 2, f), bias = random({E}, 3, f, 0.1f);
    std::vector<int64_t> idx(static_cast<size_t>(n * k));
    for (int64_t t = 0; t < n; ++t)
        for (int64_t i = 0; i < k; ++i)
            idx[static_cast<size_t>(t * k + i)] = (t * 5 + i * 3) % E;
    const Tensor idx_h{idx.data(), DType::i64, Device::cpu, {n, k}};
    const Tensor idx_d = to_device_i64(idx, gc.g.arena, gc.g.s);
    for (bool sig : {true, false})
        for (bool renorm : {true, false}) {
            const ops::RouterGradRule rule{renorm, 1e-20f, 2.5f, sig};
            Buffer dl(f, {n, E});
            Tensor ddl = gc.g.arena.tensor(f, {n, E});
            ops::router_scores_backward(
                cpu, s.view(), idx_h, dw.view(), renorm ? bias.view() : Tensor{}, rule, dl.view());
            ops::router_scores_backward(
                gc.ctx, gc.up(s), idx_d, gc.up(dw), renorm ? gc.up(bias) : Tensor{}, rule, ddl);
            expect_close("router_scores_backward", ddl, dl, gc.g.s);
        }

    const int64_t rows = 300, V = 1000;
    Buffer z = random({rows, V}, 4, f, 3.0f);
    z.ptr<float>()[5 * V + 10] = 20.0f;  // row 5: a tie, the first maximum wins
    z.ptr<float>()[5 * V + 900] = 20.0f;
    std::vector<int64_t> target(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r)
        target[static_cast<size_t>(r)] = (r * 37) % V;
    Tensor dz = gc.up(z);
    const ops::CrossEntropyRows want = ops::cross_entropy_rows(
        cpu, z.view(), Tensor{target.data(), DType::i64, Device::cpu, {rows}}, 0.25);
    const ops::CrossEntropyRows got =
        ops::cross_entropy_rows(gc.ctx, dz, to_device_i64(target, gc.g.arena, gc.g.s), 0.25);
    BOOST_TEST(got.best == want.best);
    BOOST_TEST(want.best[5] == 10);
    double err = 0;
    for (int64_t r = 0; r < rows; ++r)
        err = std::max(
            err, std::abs(got.loss[static_cast<size_t>(r)] - want.loss[static_cast<size_t>(r)]));
    BOOST_TEST(err < 1e-9);
    expect_close("cross_entropy_rows dlogits", dz, z, gc.g.s);
}

BOOST_AUTO_TEST_CASE(row_moves, *utf::precondition(need_gpu)) {
    GpuCtx gc;
    const backend::Ctx cpu = backend::cpu_ctx();
    const DType f = DType::f32;
    const std::vector<int64_t> idx{9, 2, 0, 17, 5};
    std::vector<int64_t> idx_h = idx;
    const Tensor it{idx_h.data(), DType::i64, Device::cpu, {5}};
    const Tensor dit = to_device_i64(idx, gc.g.arena, gc.g.s);
    const Buffer src = random({20, 33}, 40, f), rows = random({5, 33}, 41, f);
    Buffer got(f, {5, 33}), dst = random({20, 33}, 42, f);
    Tensor dgot = gc.g.arena.tensor(f, {5, 33}), ddst = gc.up(dst);
    ops::gather_rows(cpu, src.view(), it, got.view());
    ops::gather_rows(gc.ctx, gc.up(src), dit, dgot);
    expect_close("gather_rows", dgot, got, gc.g.s);
    ops::scatter_rows(cpu, rows.view(), it, dst.view());
    ops::scatter_rows(gc.ctx, gc.up(rows), dit, ddst);
    expect_close("scatter_rows", ddst, dst, gc.g.s);
}

BOOST_AUTO_TEST_CASE(sum_of_squares, *utf::precondition(need_gpu)) {
    GpuCtx gc;
    const Buffer x = random({300, 77}, 50, DType::f32);
    const double want = ops::sum_of_squares(backend::cpu_ctx(), x.view());
    const double got = ops::sum_of_squares(gc.ctx, gc.up(x));
    BOOST_TEST(std::abs(got - want) <= 1e-12 * want);
    // batched: each sum the single call's bit for bit
    const Buffer y = random({7, 33}, 51, DType::f32);
    const std::vector<Tensor> xs = {gc.up(x), gc.up(y)};
    std::vector<double> sums(2);
    ops::sums_of_squares(gc.ctx, xs, sums);
    BOOST_TEST(sums[0] == got);
    BOOST_TEST(sums[1] == ops::sum_of_squares(gc.ctx, xs[1]));
}

BOOST_AUTO_TEST_SUITE_END()
