// The model's two ends on a CUDA context (backend/ops_head.h) against the CPU context, exactly:
// embed_rows from an f32 and a bf16 table (the rows another tp rank holds zero), and top_logits'
// tokens (ties to the smaller id), logits and double log-sums.
#include <cstdint>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "cuda_test.h"
#include "hymoe/backend/cuda_gemm.h"
#include "hymoe/backend/ops_head.h"
#include "hymoe/backend/ops_rows.h"

namespace utf = boost::unit_test;
using namespace hymoe;
using namespace hymoe::cuda_test;

BOOST_AUTO_TEST_SUITE(cuda_ops_head, *utf::label("cuda"))

BOOST_AUTO_TEST_CASE(embed_and_top_logits_equal_cpu, *utf::precondition(need_gpu)) {
    Gpu g;
    cu::Blas blas{g.s, g.arena};
    const backend::Ctx gpu{Device::cuda, &g.s, &g.arena, &blas};
    const backend::Ctx cpu = backend::cpu_ctx();

    std::vector<int64_t> ids = {9, 3, 11, 8, 12};  // this rank: ids 8..11
    Buffer host_ids(DType::i64, {5});
    for (size_t i = 0; i < ids.size(); ++i)
        host_ids.ptr<int64_t>()[i] = ids[i];
    for (DType t : {DType::f32, DType::bf16}) {
        const Buffer table = random({4, 48}, 80, t);
        Buffer want(DType::f32, {5, 48}), got(DType::f32, {5, 48});
        ops::embed_rows(cpu, table.view(), host_ids.view(), 8, want.view());
        Tensor dh = g.arena.tensor(DType::f32, {5, 48});
        ops::embed_rows(
            gpu, to_device(table.view(), t, g.arena, g.s), to_device_i64(ids, g.arena, g.s), 8, dh);
        ops::download(gpu, dh, got.view());
        for (int64_t i = 0; i < 5 * 48; ++i)
            BOOST_TEST(got.ptr<float>()[i] == want.ptr<float>()[i]);
    }

    Buffer logits = random({3, 1000}, 81, DType::f32, 3.0f);
    logits.ptr<float>()[1000 + 17] = logits.ptr<float>()[1000 + 600] = 50.0f;  // a tie
    const int64_t n = 5;
    Buffer idx(DType::i64, {3, n}), values(DType::f32, {3, n}), sums(DType::i64, {3});
    ops::top_logits(cpu, logits.view(), idx.view(), values.view(), sums.view());
    Tensor didx = g.arena.tensor(DType::i64, {3, n}), dval = g.arena.tensor(DType::f32, {3, n});
    Tensor dsum = g.arena.tensor(DType::i64, {3});
    ops::top_logits(gpu, to_device(logits.view(), DType::f32, g.arena, g.s), didx, dval, dsum);
    Buffer gi(DType::i64, {3, n}), gv(DType::f32, {3, n}), gs(DType::i64, {3});
    ops::download(gpu, didx, gi.view());
    ops::download(gpu, dval, gv.view());
    ops::download(gpu, dsum, gs.view());
    for (int64_t i = 0; i < 3 * n; ++i) {
        BOOST_TEST(gi.ptr<int64_t>()[i] == idx.ptr<int64_t>()[i]);
        BOOST_TEST(gv.ptr<float>()[i] == values.ptr<float>()[i]);
    }
    for (int64_t i = 0; i < 3; ++i)  // one double sum each, in another order: near, not equal
        BOOST_TEST(static_cast<const double*>(gs.view().data)[i] ==
                       static_cast<const double*>(sums.view().data)[i],
                   boost::test_tools::tolerance(1e-12));
}

BOOST_AUTO_TEST_SUITE_END()
