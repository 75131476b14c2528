// The decode graphs' host side (model/decode_graph_plan.h) on the CPU: key buckets; every refusal
// of decode_graph_refusal on a model built to qualify (tiny-kimi widened to the fused MoE kernels'
// sizes), DSA on and off the fused kernels, LoRA adapters in use or not; the metadata layout
// (aligned, disjoint arrays) and its packing of 3 rows into a bucket of 4, read back array by
// array, padding included, with the block-table checks.
#include <cstdint>
#include <cstring>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "hymoe/core/error.h"
#include "hymoe/model/decode_graph_plan.h"

using namespace hymoe;
using namespace hymoe::model;
namespace cu = hymoe::backend::cuda;

namespace {

// tiny-kimi with d 128 and expert widths 64: every MoE layer fits the fused kernels.
ModelConfig graph_config() {
    ModelConfig c = preset_config("tiny-kimi");
    c.hidden_size = 128;
    c.moe.moe_intermediate = 64;
    c.moe.shared_intermediate = 64;
    return c;
}

DecodeGraphModel graph_model() {
    DecodeGraphModel m;
    m.graphs = true;
    m.fused = true;
    m.dtype = DType::bf16;
    m.kda_slots = true;
    m.n_sm = 132;
    m.max_key_bucket = 4096;
    return m;
}

DecodeGraphModel f32_model(DecodeGraphModel m) {
    m.dtype = DType::f32;
    return m;
}

// n sequences of one row each at positions pos0.
SeqBatch decode_batch(const std::vector<int64_t>& pos0) {
    SeqBatch b{{0}, pos0, {}};
    for (size_t i = 0; i < pos0.size(); ++i)
        b.offsets.push_back(static_cast<int64_t>(i) + 1);
    return b;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(decode_graph_plan)

BOOST_AUTO_TEST_CASE(key_buckets_are_powers_of_two_from_256) {
    BOOST_TEST(key_bucket(1) == 256);
    BOOST_TEST(key_bucket(256) == 256);
    BOOST_TEST(key_bucket(257) == 512);
    BOOST_TEST(key_bucket(1000) == 1024);
    BOOST_TEST(key_bucket(65536) == 65536);
    BOOST_TEST(table_width(256, 8) == 32);
    BOOST_TEST(table_width(256, 100) == 3);
}

BOOST_AUTO_TEST_CASE(every_refusal) {
    const ModelConfig c = graph_config();
    const DecodeGraphModel m = graph_model();
    const cu::DecodeBuckets buckets(16);
    const SeqBatch decode = decode_batch({5, 40, 0});
    const ForwardOptions plain;
    auto why = [&](const ModelConfig& cfg,
                   const DecodeGraphModel& model,
                   const SeqBatch& b,
                   const ForwardOptions& o = {},
                   bool resident = true) {
        return decode_graph_refusal(cfg, model, buckets, b, o, resident);
    };
    BOOST_TEST((why(c, m, decode) == GraphRefusal::none));

    DecodeGraphModel off = m;
    off.graphs = false;
    BOOST_TEST((why(c, off, decode) == GraphRefusal::off));
    off = m;
    off.fused = false;
    BOOST_TEST((why(c, off, decode) == GraphRefusal::off));
    DecodeGraphModel expert_parallel = m;  // every rank of the group must dispatch eagerly
    expert_parallel.ep = 2;
    BOOST_TEST((why(c, expert_parallel, decode) == GraphRefusal::ep));

    ForwardStats stats;
    ForwardOptions timed;
    timed.stats = &stats;
    BOOST_TEST((why(c, m, decode, timed) == GraphRefusal::stats));
    ForwardOptions chunked;  // the eager step honours the forms, a graph runs the automatic ones
    chunked.kda_mode = KdaMode::chunked;
    BOOST_TEST((why(c, m, decode, chunked) == GraphRefusal::forms));
    ForwardOptions expanded;
    expanded.attn_mode = AttnMode::expanded;
    BOOST_TEST((why(c, m, decode, expanded) == GraphRefusal::forms));
    MediaSplice media;
    media.rows = {1};
    ForwardOptions with_media;
    with_media.media = &media;
    BOOST_TEST((why(c, m, decode, with_media) == GraphRefusal::media));
    MediaSplice no_media;  // an empty splice is no media
    with_media.media = &no_media;
    BOOST_TEST((why(c, m, decode, with_media) == GraphRefusal::none));

    DecodeGraphModel adapters = m;  // a model holding two LoRA adapters
    adapters.n_adapters = 2;
    SeqBatch adapted = decode;
    adapted.adapter = {-1, 1, -1};
    BOOST_TEST((why(c, adapters, adapted) == GraphRefusal::lora));
    BOOST_TEST((why(c, m, adapted) == GraphRefusal::none));  // no adapter held: nothing applies
    adapted.adapter = {-1, 2, -1};                           // not an adapter it holds
    BOOST_TEST((why(c, adapters, adapted) == GraphRefusal::none));
    adapted.adapter = {};  // lora.h: no list is adapter 0 on every sequence
    BOOST_TEST((why(c, adapters, adapted) == GraphRefusal::lora));
    BOOST_TEST(std::strcmp(to_string(GraphRefusal::lora), "LoRA adapters in use") == 0);

    const SeqBatch prefill{{0, 1, 4}, {7, 0}, {}};  // the second sequence has three rows
    BOOST_TEST((why(c, m, prefill) == GraphRefusal::not_decode));
    BOOST_TEST((why(c, m, decode_batch({})) == GraphRefusal::not_decode));
    BOOST_TEST((why(c, m, decode_batch(std::vector<int64_t>(17, 3))) == GraphRefusal::too_many));
    BOOST_TEST((why(c, m, decode_batch(std::vector<int64_t>(16, 3))) == GraphRefusal::none));

    DecodeGraphModel no_slots = m;
    no_slots.kda_slots = false;
    BOOST_TEST((why(c, no_slots, decode) == GraphRefusal::kda));
    ModelConfig wide_kda = c;
    wide_kda.kda.head_dim = 256;
    BOOST_TEST((why(wide_kda, m, decode) == GraphRefusal::kda));

    BOOST_TEST((why(c, f32_model(m), decode) == GraphRefusal::moe));

    ModelConfig dsa = c;  // a DSA layer whose latent (r_kv 32) the sparse attention does not take
    dsa.layers[3].mixer = Mixer::dsa;
    dsa.indexer = {16, 16, 8};
    BOOST_TEST((why(dsa, m, decode) == GraphRefusal::dsa));
    ModelConfig deepseek = preset_config("tiny-deepseek");  // DSA throughout, on the fused path
    deepseek.hidden_size = 128;
    deepseek.moe.moe_intermediate = deepseek.moe.shared_intermediate = 64;
    deepseek.mla.kv_lora_rank = 128;
    deepseek.mla.qk_rope_head_dim = 16;
    BOOST_TEST((why(deepseek, m, decode) == GraphRefusal::none));
    BOOST_TEST((why(deepseek, f32_model(m), decode) == GraphRefusal::dsa));
    deepseek.mla.q_lora_rank = 0;  // the fused indexer reads the query latent
    BOOST_TEST((why(deepseek, m, decode) == GraphRefusal::dsa));

    BOOST_TEST((why(c, m, decode, plain, false) == GraphRefusal::kv_store));
    ModelConfig kda_only = c;  // no attention layer: no pages to be resident
    kda_only.layers[3].mixer = Mixer::kda;
    BOOST_TEST((why(kda_only, m, decode, plain, false) == GraphRefusal::none));

    BOOST_TEST((why(c, m, decode_batch({4095})) == GraphRefusal::none));  // 4096 keys
    BOOST_TEST((why(c, m, decode_batch({3, 4096})) == GraphRefusal::keys));
    BOOST_TEST(std::strcmp(to_string(GraphRefusal::keys), "key bucket beyond the workspace") == 0);
}

BOOST_AUTO_TEST_CASE(layout_arrays_are_aligned_and_disjoint) {
    const DecodeMetaLayout L = decode_meta_layout(5, 3, 2);
    struct Array {
        size_t at, bytes;
    };
    const std::vector<Array> arrays = {{L.tokens, 5 * 8},
                                       {L.positions, 5 * 8},
                                       {L.offsets, 6 * 8},
                                       {L.one_rows, 5 * 8},
                                       {L.row_seq, 5 * 4},
                                       {L.one_keys, 5 * 4},
                                       {L.block_table, 15 * 4},
                                       {L.kda_states, 40 * 8},
                                       {L.kda_slots, 10 * 4}};
    for (size_t i = 0; i < arrays.size(); ++i) {
        BOOST_TEST(arrays[i].at % 16 == 0u);
        BOOST_TEST(arrays[i].at + arrays[i].bytes <= L.bytes);
        for (size_t j = 0; j < i; ++j)
            BOOST_TEST((arrays[i].at >= arrays[j].at + arrays[j].bytes ||
                        arrays[j].at >= arrays[i].at + arrays[i].bytes));
    }
    BOOST_CHECK_THROW(decode_meta_layout(0, 3, 2), Error);
}

BOOST_AUTO_TEST_CASE(packing_three_rows_into_a_bucket_of_four) {
    const KdaBlockShape kda{2, 100, 30};  // two KDA layers: S of 100 floats, tails of 3 × 10
    const int page_tokens = 4;
    const DecodeMetaLayout L = decode_meta_layout(4, 3, kda.n_kda);
    const std::vector<int32_t> p0 = {7}, p1 = {2, 9, 4, 11}, p2 = {5, 6};
    std::vector<DecodeRow> rows = {{11, 2, &p0, 0x10000, 40},   // 3 keys in 1 page
                                   {12, 9, &p1, 0x20000, 50},   // 10 keys: 3 of its 4 pages
                                   {13, 4, &p2, 0x30000, 60}};  // 5 keys in 2 pages
    const DecodePadding pad{99, 0x90000, 90};
    std::vector<char> block(L.bytes, 'x');
    pack_decode_meta(L, kda, page_tokens, rows, pad, block.data());
    auto i64 = [&](size_t at, int64_t i) {
        int64_t v;
        std::memcpy(&v, block.data() + at + 8 * i, 8);
        return v;
    };
    auto i32 = [&](size_t at, int64_t i) {
        int32_t v;
        std::memcpy(&v, block.data() + at + 4 * i, 4);
        return v;
    };
    const std::vector<int64_t> tokens = {11, 12, 13, 0}, positions = {2, 9, 4, 0};
    const std::vector<int32_t> keys = {3, 10, 5, 1};
    for (int64_t r = 0; r < 4; ++r) {
        BOOST_TEST(i64(L.tokens, r) == tokens[r]);
        BOOST_TEST(i64(L.positions, r) == positions[r]);
        BOOST_TEST(i64(L.one_rows, r) == r);
        BOOST_TEST(i32(L.row_seq, r) == r);
        BOOST_TEST(i32(L.one_keys, r) == keys[r]);
    }
    for (int64_t r = 0; r <= 4; ++r)
        BOOST_TEST(i64(L.offsets, r) == r);
    const std::vector<int32_t> table = {7, -1, -1, 2, 9, 4, 5, 6, -1, 99, 99, 99};
    for (int64_t i = 0; i < 12; ++i)
        BOOST_TEST(i32(L.block_table, i) == table[i]);
    const std::vector<int64_t> state = {0x10000, 0x20000, 0x30000, 0x90000};
    const std::vector<int32_t> slot = {40, 50, 60, 90};
    for (int64_t j = 0; j < 2; ++j)
        for (int64_t r = 0; r < 4; ++r) {
            BOOST_TEST(i64(L.kda_states, j * 4 + r) == state[r] + j * 100 * 4);  // layer j's S
            for (int64_t p = 0; p < 3; ++p)  // its q, k, v conv tails, 10 floats each
                BOOST_TEST(i64(L.kda_states, ((1 + p) * 2 + j) * 4 + r) ==
                           state[r] + (2 * 100 + j * 30 + p * 10) * 4);
            BOOST_TEST(i32(L.kda_slots, j * 4 + r) == slot[r] + j);
        }

    // a table short of the keys, a table wider than the graph's, too many rows
    const std::vector<int32_t> short_table = {1};
    rows[2].pages = &short_table;
    BOOST_CHECK_THROW(pack_decode_meta(L, kda, page_tokens, rows, pad, block.data()), Error);
    rows[2].pages = &p2;
    rows[1].position = 12;  // 13 keys: 4 pages, the graph holds 3
    BOOST_CHECK_THROW(pack_decode_meta(L, kda, page_tokens, rows, pad, block.data()), Error);
    rows[1].position = 9;
    rows.push_back(rows[0]);
    rows.push_back(rows[0]);
    BOOST_CHECK_THROW(pack_decode_meta(L, kda, page_tokens, rows, pad, block.data()), Error);
}

BOOST_AUTO_TEST_SUITE_END()
