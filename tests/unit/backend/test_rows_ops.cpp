// The row moves of backend/ops_rows.h on the CPU: gather_rows and scatter_rows against direct
// indexing (f32 and bf16 rows, the untouched rows of a scatter kept), the ops on the CPU Ctx equal
// to the CPU forms, and an index out of range refused; and backend/ops_reduce.h's sum_of_squares
// against a sum of known squares. The same ops on a CUDA context are in
// tests/cuda/test_router_loss_ops.cpp.
#include <cstdint>
#include <cstring>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "hymoe/backend/ops_reduce.h"
#include "hymoe/backend/ops_rows.h"
#include "hymoe/core/error.h"

using namespace hymoe;

BOOST_AUTO_TEST_SUITE(rows_ops)

BOOST_AUTO_TEST_CASE(gather_and_scatter_by_index) {
    const int64_t n = 6, w = 5;
    std::vector<int64_t> idx = {4, 0, 5};
    const Tensor it{idx.data(), DType::i64, Device::cpu, {3}};
    for (DType t : {DType::f32, DType::bf16}) {
        Buffer src(t, {n, w}), got(t, {3, w}), got_ctx(t, {3, w});
        auto* sb = static_cast<uint8_t*>(src.view().data);
        for (size_t i = 0; i < src.view().bytes(); ++i)
            sb[i] = static_cast<uint8_t>(i * 7 + 3);
        ops::gather_rows(src.view(), it, got.view());
        ops::gather_rows(backend::cpu_ctx(), src.view(), it, got_ctx.view());
        const size_t row = static_cast<size_t>(w) * dtype_size(t);
        for (size_t i = 0; i < idx.size(); ++i)
            BOOST_TEST(std::memcmp(static_cast<const uint8_t*>(got.view().data) + i * row,
                                   sb + static_cast<size_t>(idx[i]) * row,
                                   row) == 0);
        BOOST_TEST(std::memcmp(got.view().data, got_ctx.view().data, got.view().bytes()) == 0);

        Buffer dst(t, {n, w});  // zeros
        ops::scatter_rows(backend::cpu_ctx(), got.view(), it, dst.view());
        const auto* db = static_cast<const uint8_t*>(dst.view().data);
        for (int64_t r = 0; r < n; ++r) {
            const bool listed = r == 4 || r == 0 || r == 5;
            const uint8_t* want = listed ? sb + static_cast<size_t>(r) * row : nullptr;
            for (size_t b = 0; b < row; ++b)
                BOOST_TEST(db[static_cast<size_t>(r) * row + b] == (want ? want[b] : 0));
        }
    }
    std::vector<int64_t> bad = {6};
    Buffer src(DType::f32, {n, w}), dst(DType::f32, {1, w});
    BOOST_CHECK_THROW(
        ops::gather_rows(src.view(), Tensor{bad.data(), DType::i64, Device::cpu, {1}}, dst.view()),
        Error);
}

// x_i = i − 500 over 1001 elements: Σ x² = 2 · Σ_{k=1}^{500} k² = 83583500, exact in double.
BOOST_AUTO_TEST_CASE(sum_of_squares_exact) {
    Buffer x(DType::f32, {7, 143});
    for (int64_t i = 0; i < 1001; ++i)
        x.ptr<float>()[i] = static_cast<float>(i - 500);
    BOOST_TEST(ops::sum_of_squares(x.view()) == 83583500.0);
    BOOST_TEST(ops::sum_of_squares(backend::cpu_ctx(), x.view()) == 83583500.0);
    BOOST_TEST(ops::sum_of_squares(Buffer(DType::f32, {0}).view()) == 0.0);
}

BOOST_AUTO_TEST_SUITE_END()
