// The data movement ops on a CPU context (backend/ops_rows.h) against the same moves written out:
// fill_zero clears every element; cast rounds f32 → bf16 to nearest even and widens back exactly
// (core/types.h), and copies equal dtypes; gather_rows picks rows by an i64 map (repeats and any
// order), refuses a row out of range and mismatched widths; download copies to a host tensor;
// gather_rows and scatter_rows against direct indexing (f32 and bf16 rows, a scatter's untouched
// rows kept, the CPU Ctx equal to the CPU forms); and backend/ops_reduce.h's sum_of_squares
// against a sum of known squares, batched (sums_of_squares) as well. The CUDA forms against these
// are tests/cuda/test_ops_rows.cpp and tests/cuda/test_router_loss_ops.cpp.
#include <cstdint>
#include <cstring>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "hymoe/backend/ops_reduce.h"
#include "hymoe/backend/ops_rows.h"
#include "hymoe/core/error.h"
#include "hymoe/core/rng.h"
#include "hymoe/core/types.h"

using namespace hymoe;

namespace {

Buffer random(Shape shape, uint32_t stream) {
    Buffer b(DType::f32, std::move(shape));
    Philox rng(17, stream, 0);
    rng.fill_normal(b.ptr<float>(), static_cast<size_t>(b.view().numel()), 0.0f, 1.0f);
    return b;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(ops_rows)

BOOST_AUTO_TEST_CASE(fill_zero_and_cast) {
    const backend::Ctx cpu = backend::cpu_ctx();
    Buffer x = random({5, 7}, 1);
    const float* xs = x.ptr<float>();
    Buffer b(DType::bf16, {5, 7}), back(DType::f32, {5, 7}), same(DType::f32, {35});
    ops::cast(cpu, x.view(), b.view());
    ops::cast(cpu, b.view(), back.view());
    ops::cast(cpu, x.view(), same.view());
    for (int64_t i = 0; i < 35; ++i) {
        BOOST_TEST(b.ptr<uint16_t>()[i] == float_to_bf16(xs[i]));
        BOOST_TEST(back.ptr<float>()[i] == bf16_to_float(float_to_bf16(xs[i])));
        BOOST_TEST(same.ptr<float>()[i] == xs[i]);
    }
    Buffer wrong(DType::f32, {34});
    BOOST_CHECK_THROW(ops::cast(cpu, x.view(), wrong.view()), Error);
    Buffer ints(DType::i32, {5, 7});
    BOOST_CHECK_THROW(ops::cast(cpu, x.view(), ints.view()), Error);
    ops::fill_zero(cpu, x.view());
    for (int64_t i = 0; i < 35; ++i)
        BOOST_TEST(xs[i] == 0.0f);
}

BOOST_AUTO_TEST_CASE(gather_rows_and_download) {
    const backend::Ctx cpu = backend::cpu_ctx();
    const Buffer src = random({4, 6}, 2);
    const std::vector<int64_t> map = {3, 0, 3, 2, 1};
    Buffer idx(DType::i64, {5});
    std::memcpy(idx.view().data, map.data(), map.size() * sizeof(int64_t));
    Buffer dst(DType::f32, {5, 6});
    ops::gather_rows(cpu, src.view(), idx.view(), dst.view());
    for (int64_t i = 0; i < 5; ++i)
        for (int64_t j = 0; j < 6; ++j)
            BOOST_TEST(dst.ptr<float>()[i * 6 + j] == src.ptr<float>()[map[i] * 6 + j]);
    idx.ptr<int64_t>()[2] = 4;  // past the 4 rows of src
    BOOST_CHECK_THROW(ops::gather_rows(cpu, src.view(), idx.view(), dst.view()), Error);
    Buffer narrow(DType::f32, {5, 5});
    BOOST_CHECK_THROW(ops::gather_rows(cpu, src.view(), idx.view(), narrow.view()), Error);

    Buffer host(DType::f32, {24});
    ops::download(cpu, src.view(), host.view());
    BOOST_TEST(std::memcmp(host.view().data, src.view().data, src.view().bytes()) == 0);
    ops::synchronize(cpu);  // nothing queued on a CPU context: returns at once
}

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
    // batched: each the single call's, an empty tensor 0
    Buffer y(DType::f32, {5}), none(DType::f32, {0});
    for (int64_t i = 0; i < 5; ++i)
        y.ptr<float>()[i] = 0.5f * static_cast<float>(i);
    const std::vector<Tensor> xs = {x.view(), none.view(), y.view()};
    std::vector<double> sums(3, -1.0);
    ops::sums_of_squares(backend::cpu_ctx(), xs, sums);
    BOOST_TEST(sums[0] == 83583500.0);
    BOOST_TEST(sums[1] == 0.0);
    BOOST_TEST(sums[2] == 7.5);  // 0.25 · (1 + 4 + 9 + 16)
}

BOOST_AUTO_TEST_SUITE_END()
