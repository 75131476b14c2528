// Unit tests of the host side of KDA's batched forward (model/kda_views.h, lora_views.h): the
// sequence table's arrays for a batch (offsets, each row's sequence, the longest sequence, each
// state's S and q/k/v tails in their planes; a state count that does not match is refused), and
// adapters as factor views on row lists (what the GPU model uploads) adding what the host slot's
// lora_forward adds, on a batch whose sequences use different adapters.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "hymoe/core/error.h"
#include "hymoe/core/rng.h"
#include "hymoe/model/kda_views.h"
#include "hymoe/model/lora.h"
#include "hymoe/model/lora_rows.h"
#include "hymoe/model/lora_views.h"

namespace {

using namespace hymoe;
using namespace hymoe::model;

}  // namespace

BOOST_AUTO_TEST_SUITE(kda_table)

BOOST_AUTO_TEST_CASE(table_arrays_place_every_sequence_and_its_states) {
    ModelConfig cfg;
    cfg.hidden_size = 16;
    cfg.kda.n_head = 2;
    cfg.kda.head_dim = 4;
    cfg.kda.conv_kernel = 3;
    std::vector<KdaState> st;
    std::vector<KdaStateViews> views;
    for (int s = 0; s < 3; ++s)
        st.push_back(make_kda_state(cfg));
    for (KdaState& s : st)
        views.push_back(kda_views(s));
    const SeqBatch batch{{0, 2, 7, 8}, {0, 4, 9}, {}};
    const KdaTableArrays a = kda_table_arrays(batch, views);
    const ops::KdaSeqTable t = a.table();
    BOOST_TEST(t.n_tok == 8);
    BOOST_TEST(t.n_seq == 3);
    BOOST_TEST(t.max_len == 5);
    const std::vector<int32_t> row_seq = {0, 0, 1, 1, 1, 1, 1, 2};
    for (int64_t r = 0; r < 8; ++r)
        BOOST_TEST(t.row_seq[r] == row_seq[r]);
    for (int64_t s = 0; s <= 3; ++s)
        BOOST_TEST(t.offsets[s] == batch.offsets[s]);
    for (int64_t s = 0; s < 3; ++s) {
        BOOST_TEST(t.state[s] == st[s].S.ptr<float>());
        BOOST_TEST(t.tail[0][s] == st[s].q_tail.ptr<float>());
        BOOST_TEST(t.tail[1][s] == st[s].k_tail.ptr<float>());
        BOOST_TEST(t.tail[2][s] == st[s].v_tail.ptr<float>());
    }
    views.pop_back();
    BOOST_CHECK_THROW(kda_table_arrays(batch, views), Error);
}

BOOST_AUTO_TEST_CASE(factor_views_on_row_lists_add_what_the_host_slot_adds) {
    const int64_t in = 12, out = 10;
    LoraSlot slot;  // adapter 0 and adapter 2 (adapter 1 leaves the projection alone)
    for (int a = 0; a < 3; ++a) {
        LoraPair& p = slot.adapters.emplace_back();
        if (a == 1)
            continue;
        p = make_lora_pair(
            out, in, 3, 0.5f + static_cast<float>(a), 7, static_cast<uint32_t>(a), false);
        Philox(9, static_cast<uint32_t>(a), 0).fill_normal(p.B.ptr<float>(), out * 3, 0.0f, 0.4f);
    }
    LoraSlotView factors;
    for (const LoraPair& p : slot.adapters)
        factors.push_back({p.A.view(), p.B.view(), p.scale});
    const SeqBatch batch{{0, 3, 4, 9, 11}, {0, 0, 0, 0}, {2, 1, 0, 2}};
    const LoraRows lr = adapter_rows(batch, 3);
    std::vector<LoraRowsView> rows;
    std::vector<Buffer> keep;
    for (const LoraSegment& seg : lr.segments) {
        Buffer& r = keep.emplace_back(DType::i64, Shape{seg.count});
        for (int64_t i = 0; i < seg.count; ++i)
            r.ptr<int64_t>()[i] = lr.rows[static_cast<size_t>(seg.begin + i)];
        rows.push_back({seg.adapter, r.view()});
    }
    const int64_t n = batch.n_tok();
    Buffer x(DType::f32, {n, in}), want(DType::f32, {n, out}), got(DType::f32, {n, out});
    Philox(1, 0, 0).fill_normal(x.ptr<float>(), static_cast<size_t>(n * in), 0.0f, 1.0f);
    Philox(1, 1, 0).fill_normal(want.ptr<float>(), static_cast<size_t>(n * out), 0.0f, 1.0f);
    std::vector<float> before(want.ptr<float>(), want.ptr<float>() + n * out);
    for (int64_t i = 0; i < n * out; ++i)
        got.ptr<float>()[i] = before[static_cast<size_t>(i)];
    const backend::Ctx cpu = backend::cpu_ctx();
    Tensor wv = want.view(), gv = got.view();
    lora_forward(cpu, &slot, {}, batch, nullptr, x.view(), wv);
    lora_forward(cpu, nullptr, factors, batch, &rows, x.view(), gv);
    float err = 0.0f;
    for (int64_t i = 0; i < n * out; ++i)
        err = std::max(err, std::abs(got.ptr<float>()[i] - want.ptr<float>()[i]));
    BOOST_TEST(err < 1e-5f);
    // row 3 (sequence 1, adapter 1: none here) untouched, row 0 (adapter 2) moved
    BOOST_TEST(got.ptr<float>()[3 * out] == before[3 * out]);
    BOOST_TEST(got.ptr<float>()[0] != before[0]);
}

BOOST_AUTO_TEST_SUITE_END()
