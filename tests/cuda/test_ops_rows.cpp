// The data movement ops on a CUDA context (backend/ops_rows.h) against the CPU context, exactly:
// fill_zero, the f32 → bf16 cast (round to nearest even) and back, the row gather (repeats, any
// order), the download to the host, and zero-row calls that queue nothing.
#include <cstdint>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "cuda_test.h"
#include "hymoe/backend/cuda_gemm.h"
#include "hymoe/backend/ops_rows.h"

namespace utf = boost::unit_test;
using namespace hymoe;
using namespace hymoe::cuda_test;

BOOST_AUTO_TEST_SUITE(cuda_ops_rows, *utf::label("cuda"))

BOOST_AUTO_TEST_CASE(cast_gather_zero_download_equal_cpu, *utf::precondition(need_gpu)) {
    Gpu g;
    cu::Blas blas{g.s, g.arena};
    const backend::Ctx gpu{Device::cuda, &g.s, &g.arena, &blas};
    const backend::Ctx cpu = backend::cpu_ctx();

    const Buffer x = random({6, 40}, 70, DType::f32);
    const Tensor dx = to_device(x.view(), DType::f32, g.arena, g.s);
    Buffer hb(DType::bf16, {6, 40}), want(DType::f32, {6, 40});  // CPU: round, widen back
    ops::cast(cpu, x.view(), hb.view());
    ops::cast(cpu, hb.view(), want.view());
    Tensor db = g.arena.tensor(DType::bf16, {6, 40});
    ops::cast(gpu, dx, db);
    Buffer got = to_host(db, g.s);  // widened on the way back
    for (int64_t i = 0; i < 240; ++i)
        BOOST_TEST(got.ptr<float>()[i] == want.ptr<float>()[i]);

    const std::vector<int64_t> map = {5, 0, 5, 3};
    Buffer idx(DType::i64, {4}), rows(DType::f32, {4, 40});
    for (size_t i = 0; i < map.size(); ++i)
        idx.ptr<int64_t>()[i] = map[i];
    ops::gather_rows(cpu, x.view(), idx.view(), rows.view());
    Tensor drows = g.arena.tensor(DType::f32, {4, 40});
    ops::gather_rows(gpu, dx, to_device_i64(map, g.arena, g.s), drows);
    Buffer down(DType::f32, {4, 40});
    ops::download(gpu, drows, down.view());  // complete on return
    for (int64_t i = 0; i < 160; ++i)
        BOOST_TEST(down.ptr<float>()[i] == rows.ptr<float>()[i]);

    ops::fill_zero(gpu, drows);
    ops::download(gpu, drows, down.view());
    for (int64_t i = 0; i < 160; ++i)
        BOOST_TEST(down.ptr<float>()[i] == 0.0f);

    Tensor none = g.arena.tensor(DType::bf16, {0, 40}),
           none_f = g.arena.tensor(DType::f32, {0, 40});
    ops::cast(gpu, none_f, none);
    ops::fill_zero(gpu, none);
    ops::synchronize(gpu);
}

BOOST_AUTO_TEST_SUITE_END()
