// The MLA/DSA forward over a device step's rows (model/attention_views.h DeviceAttnRows: one page
// buffer, a block-table row a sequence, the positions and row map given, as the GPU model's step
// passes them) on a CPU context against the same layer over host caches, bit for bit: for the
// first attention layer of each tiny family (gated MLA, MLA, DSA), three steps of two sequences
// (prefill chunks, decode rows, a chunk beside a decode row) over pages handed out out of order.
// The tables are model/step_tables.h's, as the GPU step builds them.
#include <cstdint>
#include <string>
#include <vector>

#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include "hymoe/core/rng.h"
#include "hymoe/model/attention_views.h"
#include "hymoe/model/model.h"
#include "hymoe/model/step_tables.h"

namespace data = boost::unit_test::data;
using namespace hymoe;
using namespace hymoe::model;

namespace {

const std::vector<std::string> kPresets = {"tiny", "tiny-kimi", "tiny-deepseek"};

SeqBatch step_of(std::vector<int64_t> lengths, std::vector<int64_t> pos0) {
    SeqBatch b;
    b.offsets = {0};
    for (int64_t n : lengths)
        b.offsets.push_back(b.offsets.back() + n);
    b.pos0 = std::move(pos0);
    return b;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(attention_device_rows)

BOOST_DATA_TEST_CASE(device_rows_equal_host_caches, data::make(kPresets), preset) {
    Model m = make_model(preset_config(preset));
    init_model_random(m, 3);
    int layer = 0;
    while (m.cfg.layers[layer].mixer == Mixer::kda)
        ++layer;
    const LayerSpec& spec = m.cfg.layers[layer];
    const MlaWeightViews w = attention_views(m.layers[layer].attn);
    const backend::Ctx cpu = backend::cpu_ctx();
    const int64_t d = m.cfg.hidden_size;
    const int64_t width = m.cfg.mla.kv_lora_rank + m.cfg.mla.qk_rope_head_dim +
                          (spec.mixer == Mixer::dsa ? m.cfg.indexer.head_dim : 0);
    const int page_tokens = 4;
    Buffer pages(DType::f32, {8, page_tokens, width});  // 8 pages of every sequence's rows
    const std::vector<int32_t> table0 = {5, 1, 6, 2}, table1 = {0, 7, 3, 4};
    std::vector<AttnCache> host(2);  // the reference: each sequence's own cache
    const std::vector<SeqBatch> steps = {
        step_of({5, 3}, {0, 0}), step_of({1, 1}, {5, 3}), step_of({2, 1}, {6, 4})};
    Philox rng(9, 4, 0);
    for (const SeqBatch& batch : steps) {
        const int64_t n = batch.n_tok();
        Buffer x(DType::f32, {n, d}), want(DType::f32, {n, d}), got(DType::f32, {n, d});
        rng.fill_normal(x.ptr<float>(), static_cast<size_t>(n * d), 0.0f, 1.0f);
        attention_forward(cpu, m.cfg, spec, w, x.view(), batch, {&host[0], &host[1]}, want.view());

        RowTables rows = row_tables(batch);
        BlockTables blocks = block_tables(batch, {&table0, &table1}, page_tokens);
        OneRows one = one_rows(batch, blocks);
        DeviceAttnRows dev;
        dev.pages.r_kv = m.cfg.mla.kv_lora_rank;
        dev.pages.d_r = m.cfg.mla.qk_rope_head_dim;
        dev.pages.d_i = width - dev.pages.r_kv - dev.pages.d_r;
        dev.pages.page_tokens = page_tokens;
        dev.pages.row_stride = width;
        dev.pages.base = pages.ptr<float>();
        dev.pages.page_stride = page_tokens * width;
        dev.pages.block_table = blocks.table.data();
        dev.pages.max_pages = blocks.max_pages;
        dev.pos = Tensor{rows.positions.data(), DType::i64, Device::cpu, {n}};
        dev.row_seq = Tensor{rows.row_seq.data(), DType::i32, Device::cpu, {n}};
        dev.rows.row_seq = rows.row_seq.data();
        dev.rows.visible = rows.visible.data();
        dev.rows.n_one = static_cast<int64_t>(one.rows.size());
        dev.rows.one_rows = one.rows.data();
        dev.rows.one_table = one.table.data();
        dev.rows.one_keys = one.keys.data();
        dev.rows.one_max_keys = one.max_keys;
        attention_forward(cpu,
                          m.cfg,
                          spec,
                          w,
                          x.view(),
                          batch,
                          {},
                          got.view(),
                          AttnMode::automatic,
                          nullptr,
                          nullptr,
                          &dev);
        for (int64_t i = 0; i < n * d; ++i)
            BOOST_TEST(got.ptr<float>()[i] == want.ptr<float>()[i]);
    }
    BOOST_TEST(host[0].n == 8);  // the host caches advanced; the device rows left counting to
    BOOST_TEST(host[1].n == 5);  //   their caller
}

BOOST_AUTO_TEST_SUITE_END()
