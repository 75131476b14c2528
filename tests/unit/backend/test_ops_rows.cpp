// The data movement ops on a CPU context (backend/ops_rows.h) against the same moves written out:
// fill_zero clears every element; cast rounds f32 → bf16 to nearest even and widens back exactly
// (core/types.h), and copies equal dtypes; gather_rows picks rows by an i64 map (repeats and any
// order), refuses a row out of range and mismatched widths; download copies to a host tensor.
// The CUDA forms against these are tests/cuda/test_ops_rows.cpp.
#include <cstdint>
#include <cstring>
#include <vector>

#include <boost/test/unit_test.hpp>

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

BOOST_AUTO_TEST_SUITE_END()
