// The MoE groups (backend/moe_groups.h) and the MoE ops on a CPU context (backend/ops_moe.h):
// the host plan on a hand-worked routing (offsets, each slot's grouped row, −1 for slots not
// computed, an id past E refused); the gather, the grouped product and the weighted combine equal
// the same arithmetic written out per row, bit for bit (scale by weight, ops::linear on each
// expert's rows, fp32 sums in slot order, rows without a slot zero); mismatched shapes refused.
// The CUDA forms against these are tests/cuda/test_moe_ops.cpp.
#include <cstring>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "hymoe/backend/moe_groups.h"
#include "hymoe/backend/ops.h"
#include "hymoe/backend/ops_moe.h"
#include "hymoe/core/error.h"
#include "hymoe/core/rng.h"

using namespace hymoe;

namespace {

Buffer random(Shape shape, uint32_t stream) {
    Buffer b(DType::f32, std::move(shape));
    Philox rng(11, stream, 0);
    rng.fill_normal(b.ptr<float>(), static_cast<size_t>(b.view().numel()), 0.0f, 1.0f);
    return b;
}

Buffer i64_of(const std::vector<int64_t>& v) {
    Buffer b(DType::i64, {static_cast<int64_t>(v.size())});
    std::memcpy(b.view().data, v.data(), v.size() * sizeof(int64_t));
    return b;
}

// 4 rows, k = 2, E = 3: row 2 has no computed slot, row 3 one.
const std::vector<int32_t> kExpert = {2, 0, 0, 2, -1, -1, 1, -1};

}  // namespace

BOOST_AUTO_TEST_SUITE(moe_ops)

BOOST_AUTO_TEST_CASE(groups_by_expert_rows_ascending) {
    const backend::MoeGroups g = backend::moe_group_rows(kExpert.data(), 4, 2, 3);
    BOOST_TEST(g.offset == (std::vector<int64_t>{0, 2, 3, 5}), boost::test_tools::per_element());
    // expert 0: slots 1, 2 → rows 0, 1; expert 1: slot 6 → row 2; expert 2: slots 0, 3 → 3, 4
    BOOST_TEST(g.row == (std::vector<int64_t>{3, 0, 1, 4, -1, -1, 2, -1}),
               boost::test_tools::per_element());
    BOOST_TEST(g.n_rows() == 5);
    BOOST_TEST(g.rows_per_expert() == (std::vector<int64_t>{2, 1, 2}),
               boost::test_tools::per_element());
    const std::vector<int32_t> bad = {0, 3};
    BOOST_CHECK_THROW(backend::moe_group_rows(bad.data(), 1, 2, 3), Error);
}

BOOST_AUTO_TEST_CASE(gather_product_combine_as_written_out) {
    const int64_t n = 4, k = 2, E = 3, w = 5, out_w = 6;
    const backend::MoeGroups g = backend::moe_group_rows(kExpert.data(), n, k, E);
    const Buffer row = i64_of(g.row);
    const Buffer x = random({n, w}, 1);
    const Buffer weight = random({n * k}, 2);
    std::vector<Buffer> mats;
    std::vector<Tensor> views;
    for (int64_t e = 0; e < E; ++e) {
        mats.push_back(random({out_w, w}, static_cast<uint32_t>(3 + e)));
        views.push_back(mats.back().view());
    }
    const backend::Ctx ctx = backend::cpu_ctx();

    Buffer in(DType::f32, {g.n_rows(), w});
    ops::moe_gather(ctx, x.view(), row.view(), k, in.view());
    for (int64_t a = 0; a < n * k; ++a)
        if (g.row[a] >= 0)
            BOOST_TEST(std::memcmp(in.ptr<float>() + g.row[a] * w,
                                   x.ptr<float>() + a / k * w,
                                   w * sizeof(float)) == 0);

    Buffer prod(DType::f32, {g.n_rows(), out_w});
    ops::grouped_linear(ctx, in.view(), views, g.rows_per_expert(), prod.view());
    for (int64_t e = 0; e < E; ++e) {
        const int64_t begin = g.offset[e], rows = g.offset[e + 1] - begin;
        Buffer want(DType::f32, {rows, out_w});
        ops::linear(in.view().rows(begin, rows), views[e], want.view());
        BOOST_TEST(std::memcmp(want.view().data,
                               prod.ptr<float>() + begin * out_w,
                               want.view().bytes()) == 0);
    }

    Buffer y = random({n, out_w}, 9);  // overwritten, rows without a slot included
    ops::moe_combine(ctx, prod.view(), row.view(), weight.view(), k, y.view());
    for (int64_t t = 0; t < n; ++t)
        for (int64_t j = 0; j < out_w; ++j) {
            float want = 0.0f;
            for (int64_t i = 0; i < k; ++i)
                if (g.row[t * k + i] >= 0)
                    want += weight.ptr<float>()[t * k + i] *
                            prod.ptr<float>()[g.row[t * k + i] * out_w + j];
            BOOST_TEST(y.ptr<float>()[t * out_w + j] == want);
        }
    BOOST_TEST(y.ptr<float>()[2 * out_w] == 0.0f);

    // the CPU gather's weighted form: each row scaled by its slot's weight
    ops::moe_gather(x.view(), row.view(), weight.ptr<float>(), k, in.view());
    BOOST_TEST(in.ptr<float>()[3 * w + 1] == weight.ptr<float>()[0] * x.ptr<float>()[1]);
}

BOOST_AUTO_TEST_CASE(shapes_checked) {
    const backend::MoeGroups g = backend::moe_group_rows(kExpert.data(), 4, 2, 3);
    const Buffer row = i64_of(g.row);
    const Buffer x = random({3, 5}, 1);  // 3 rows for a map of 4 × 2 slots
    Buffer in(DType::f32, {g.n_rows(), 5});
    BOOST_CHECK_THROW(ops::moe_gather(backend::cpu_ctx(), x.view(), row.view(), 2, in.view()),
                      Error);
    Buffer y(DType::f32, {4, 5});
    const Buffer short_weight = random({7}, 2);
    BOOST_CHECK_THROW(
        ops::moe_combine(
            backend::cpu_ctx(), in.view(), row.view(), short_weight.view(), 2, y.view()),
        Error);
}

BOOST_AUTO_TEST_SUITE_END()
