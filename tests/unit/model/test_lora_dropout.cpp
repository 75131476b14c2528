// Adapter dropout on factor views (model/lora_views.h, ops::dropout_rows: the GPU trainer's form,
// here on a CPU context) against the host slots' (model/lora.h): the same adapter on a packed batch
// of two sequences gives the host slot's output and, backward, its dx, dA and dB (≤ 1e-6), the
// masks being the same draws; and the mask itself: the kept fraction near 1 − p, each kept entry
// scaled by 1/(1 − p), a row's mask the same whatever the rows around it.
#include <cmath>
#include <cstring>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "hymoe/backend/ops_dropout.h"
#include "hymoe/core/rng.h"
#include "hymoe/model/lora.h"
#include "hymoe/model/lora_views.h"

using namespace hymoe;
using namespace hymoe::model;

namespace {

Buffer random(Shape shape, uint32_t stream) {
    Buffer b(DType::f32, std::move(shape));
    Philox(23, stream, 0).fill_normal(b.ptr<float>(), static_cast<size_t>(b.view().numel()), 0, 1);
    return b;
}

double max_diff(const Buffer& a, const Buffer& b) {
    double d = 0;
    for (int64_t i = 0; i < a.view().numel(); ++i)
        d = std::max(d, static_cast<double>(std::abs(a.ptr<float>()[i] - b.ptr<float>()[i])));
    return d;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(lora_dropout)

BOOST_AUTO_TEST_CASE(factor_views_draw_the_host_slots_masks) {
    const int64_t n = 13, in = 24, out = 10, r = 4;
    LoraSlot slot;
    slot.adapters.push_back(make_lora_pair(out, in, r, 0.5f, 7, 3, true));
    Philox(4, 0, 0).fill_normal(slot.adapters[0].B.ptr<float>(), out * r, 0, 0.3f);
    slot.dropout = 0.3f, slot.dropout_seed = 99, slot.dropout_stream = 5;
    const SeqBatch batch{{0, 8, 13}, {0, 0}, {}};
    const Buffer x = random({n, in}, 1), dy = random({n, out}, 2);

    Buffer y_host(DType::f32, {n, out}), dx_host(DType::f32, {n, in});
    lora_forward(&slot, batch, x.view(), y_host.view());
    lora_backward(&slot, batch, x.view(), dy.view(), dx_host.view());

    const LoraPair& p = slot.adapters[0];
    Buffer dA(DType::f32, p.A.view().shape), dB(DType::f32, p.B.view().shape);
    const LoraSlotView factors = {
        LoraFactorsView{p.A.view(), p.B.view(), p.scale, dA.view(), dB.view(), &slot}};
    std::vector<int64_t> all(n);
    for (int64_t t = 0; t < n; ++t)
        all[t] = t;
    const std::vector<LoraRowsView> rows = {{0, Tensor{all.data(), DType::i64, Device::cpu, {n}}}};
    const backend::Ctx ctx = backend::cpu_ctx();
    Buffer y(DType::f32, {n, out}), dx(DType::f32, {n, in});
    Tensor yv = y.view(), dxv = dx.view();
    lora_forward(ctx, nullptr, factors, batch, &rows, x.view(), yv);
    lora_backward(ctx, nullptr, factors, batch, &rows, x.view(), dy.view(), dxv);
    BOOST_TEST(max_diff(y, y_host) <= 1e-6);
    BOOST_TEST(max_diff(dx, dx_host) <= 1e-6);
    BOOST_TEST(max_diff(dA, p.dA) <= 1e-6);
    BOOST_TEST(max_diff(dB, p.dB) <= 1e-6);
    BOOST_TEST(max_diff(y, Buffer(DType::f32, {n, out})) > 1e-2);  // the adapter did something
}

BOOST_AUTO_TEST_CASE(a_rows_mask_keeps_one_minus_p_scaled) {
    const int64_t n = 64, in = 256;
    Buffer ones(DType::f32, {n, in}), y(DType::f32, {n, in});
    std::fill_n(ones.ptr<float>(), n * in, 1.0f);
    const ops::DropoutKey key{0.25f, 5, 2};
    ops::dropout_rows(ones.view(), key, y.view());
    int64_t kept = 0;
    for (int64_t i = 0; i < n * in; ++i) {
        const float v = y.ptr<float>()[i];
        BOOST_REQUIRE(v == 0.0f || v == 1.0f / 0.75f);
        kept += v != 0.0f;
    }
    BOOST_TEST(std::abs(static_cast<double>(kept) / (n * in) - 0.75) < 0.02);
    Buffer first(DType::f32, {1, in});  // row 0 alone draws row 0's mask
    ops::dropout_rows(ones.view().rows(0, 1), key, first.view());
    BOOST_TEST(std::memcmp(first.view().data, y.view().data, in * sizeof(float)) == 0);
}

BOOST_AUTO_TEST_SUITE_END()
