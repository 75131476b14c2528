// Unit tests of the paged attention cache (hymoe/model/kv_cache.h): reserve and release keep the
// free list and the block tables disjoint and within capacity; and a DSA layer fed in chunks
// through a pool of small pages gives bit for bit the outputs of the same layer caching in its
// private arrays (paging only moves where rows live); bf16 and f16 pools store rows rounded to
// nearest even at half the page bytes; and the tiny-deepseek model over a bf16 pool stays within
// the bf16 rounding bound of its fp32-pool logits, with the same greedy tokens nearly always; a
// pool's latent view (backend/latent_cache.h) addresses the rows read_row and write_row do.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "hymoe/backend/latent_cache.h"
#include "hymoe/core/rng.h"
#include "hymoe/model/attention.h"
#include "hymoe/model/kv_cache.h"
#include "hymoe/model/model.h"

namespace {

using namespace hymoe;
using namespace hymoe::model;

// Logits of tiny-deepseek (four DSA layers, seed 5) over a pool of `dtype` rows: two sequences,
// chunks of 7 and 5 tokens three times, then 20 decode steps together; the last logits of each
// sequence per step, [steps · 2, V].
std::vector<float> paged_logits(Model& m, DType dtype) {
    KvPool pool(m.local, m.shard, 4, 64, {}, dtype);
    std::vector<SequenceState> st(2);
    for (auto& s : st) {
        s = make_sequence_state(m);
        attach_kv_pool(m, s, pool);
    }
    std::vector<float> out;
    for (int step = 0; step < 23; ++step) {
        const int64_t na = step < 3 ? 7 : 1, nb = step < 3 ? 5 : 1;
        std::vector<int64_t> tokens;
        for (int64_t i = 0; i < na + nb; ++i)
            tokens.push_back((step * 31 + i * 7 + 3) % m.cfg.vocab_size);
        BOOST_REQUIRE(pool.reserve(st[0].pages, st[0].n_tokens + na));
        BOOST_REQUIRE(pool.reserve(st[1].pages, st[1].n_tokens + nb));
        Buffer logits;
        forward(m,
                tokens,
                SeqBatch{{0, na, na + nb}, {st[0].n_tokens, st[1].n_tokens}, {}},
                {&st[0], &st[1]},
                logits,
                {Logits::last});
        out.insert(out.end(), logits.ptr<float>(), logits.ptr<float>() + logits.view().numel());
    }
    for (auto& s : st)
        pool.release(s.pages);
    return out;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(kv_cache)

BOOST_AUTO_TEST_CASE(reserve_and_release_keep_pages_disjoint) {
    const ModelConfig cfg = preset_config("tiny");
    KvPool pool(cfg, whole_model(cfg), 4, 5);  // 5 pages of 4 tokens
    std::vector<int32_t> a, b;
    BOOST_TEST(pool.reserve(a, 9));  // 3 pages
    BOOST_TEST(a.size() == 3u);
    BOOST_TEST(pool.reserve(a, 12));  // still 3
    BOOST_TEST(a.size() == 3u);
    BOOST_TEST(!pool.reserve(b, 12));  // 3 more do not fit: nothing taken
    BOOST_TEST(b.empty());
    BOOST_TEST(pool.free_pages() == 2);
    BOOST_TEST(pool.reserve(b, 8));
    std::set<int32_t> all(a.begin(), a.end());
    all.insert(b.begin(), b.end());
    BOOST_TEST(all.size() == 5u);  // no page twice
    pool.release(a);
    BOOST_TEST(a.empty());
    BOOST_TEST(pool.free_pages() == 3);
    std::vector<int32_t> c;
    BOOST_TEST(pool.reserve(c, 12));  // the freed pages come back
    for (int32_t p : c)
        BOOST_TEST(std::count(b.begin(), b.end(), p) == 0);
    // a DSA layer's row: [c_kv 32 | k_r 8 | k_idx 16] of the tiny preset
    BOOST_TEST(pool.row_width(3) == 32 + 8 + 16);
    BOOST_TEST(pool.row_width(0) == 0);  // a KDA layer
}

BOOST_AUTO_TEST_CASE(paged_dsa_layer_equals_private_cache_bit_for_bit) {
    const ModelConfig cfg = preset_config("tiny");  // layer 3: gated DSA, indexer top-8
    const int layer = 3;
    const LayerSpec spec = cfg.layers[layer];
    MlaWeights w;
    Philox rng(11, 0, 0);
    init_random(attention_tensors(cfg, spec, w), rng);
    const int64_t n = 37, d = cfg.hidden_size;
    Buffer x(DType::f32, {n, d});
    rng.fill_normal(x.ptr<float>(), static_cast<size_t>(n * d), 0.0f, 1.0f);
    KvPool pool(cfg, whole_model(cfg), 4, 16);
    std::vector<int32_t> table;
    AttnCache paged, own;
    paged.pool = &pool, paged.pages = &table, paged.layer = layer;
    Buffer y_paged(DType::f32, {n, d}), y_own(DType::f32, {n, d});
    for (int64_t begin = 0; begin < n;) {  // chunks of 5, then one token at a time
        const int64_t len = begin < 25 ? std::min<int64_t>(5, n - begin) : 1;
        BOOST_REQUIRE(pool.reserve(table, begin + len));
        const Tensor xs = x.view().rows(begin, len);
        Tensor yp = y_paged.view().rows(begin, len), yo = y_own.view().rows(begin, len);
        attention_forward(
            backend::cpu_ctx(), cfg, spec, w, xs, single_sequence(len, begin), {&paged}, yp);
        attention_forward(
            backend::cpu_ctx(), cfg, spec, w, xs, single_sequence(len, begin), {&own}, yo);
        begin += len;
    }
    BOOST_TEST(table.size() == 10u);  // ⌈37 / 4⌉
    BOOST_TEST(std::memcmp(y_paged.ptr<float>(), y_own.ptr<float>(), y_own.view().bytes()) == 0);
}

BOOST_AUTO_TEST_CASE(bf16_and_f16_rows_round_to_nearest_even_at_half_the_bytes) {
    const ModelConfig cfg = preset_config("tiny-deepseek");  // DDDD: rows of 32 + 8 + 16
    const int64_t row = 32 + 8 + 16;
    std::vector<float> in(static_cast<size_t>(row)), out(static_cast<size_t>(row));
    for (int64_t i = 0; i < row; ++i)
        in[static_cast<size_t>(i)] =
            0.1f * static_cast<float>(i) - 2.3f + 1e-4f * static_cast<float>(i);
    for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
        KvPool pool(cfg, whole_model(cfg), 4, 3, {}, dtype);
        const int64_t bytes = static_cast<int64_t>(dtype_size(dtype));
        BOOST_TEST(pool.page_bytes() == 4 * row * 4 * bytes);  // 4 layers of 4 tokens
        BOOST_TEST(pool.layer_page_bytes(2) == 4 * row * bytes);
        std::vector<int32_t> table;
        BOOST_REQUIRE(pool.reserve(table, 9));
        pool.write_row(2, table[1], 3, 0, 40, in.data());        // c_kv and k_r
        pool.write_row(2, table[1], 3, 40, 16, in.data() + 40);  // k_idx
        pool.read_row(2, table[1], 3, 0, row, out.data());
        int64_t bad = 0;
        for (int64_t i = 0; i < row; ++i) {
            const float x = in[static_cast<size_t>(i)];
            const float want = dtype == DType::f32    ? x
                               : dtype == DType::bf16 ? bf16_to_float(float_to_bf16(x))
                                                      : f16_to_float(float_to_f16(x));
            bad += std::memcmp(&want, &out[static_cast<size_t>(i)], 4) != 0;
        }
        BOOST_TEST(bad == 0, to_string(dtype));
        std::vector<float> k_r(8);
        pool.read_row(2, table[1], 3, 32, 8, k_r.data());  // an offset read: k_r alone
        BOOST_TEST(std::memcmp(k_r.data(), out.data() + 32, 8 * 4) == 0);
    }
}

// The largest logit difference and the greedy tokens that agree, fp32 vs bf16 cache rows.
struct Drift {
    float max_diff = 0, max_abs = 0;
    int64_t same = 0, rows = 0;
};
Drift drift(Model& m) {
    const std::vector<float> ref = paged_logits(m, DType::f32), got = paged_logits(m, DType::bf16);
    BOOST_REQUIRE(ref.size() == got.size());
    const int64_t V = m.cfg.vocab_size;
    Drift d;
    d.rows = static_cast<int64_t>(ref.size()) / V;
    for (int64_t r = 0; r < d.rows; ++r) {
        const float* a = ref.data() + r * V;
        const float* b = got.data() + r * V;
        for (int64_t j = 0; j < V; ++j) {
            d.max_abs = std::max(d.max_abs, std::abs(a[j]));
            d.max_diff = std::max(d.max_diff, std::abs(a[j] - b[j]));
        }
        d.same += std::max_element(a, a + V) - a == std::max_element(b, b + V) - b;
    }
    BOOST_TEST_MESSAGE("bf16 vs fp32 KV rows, indexer top-"
                       << m.cfg.indexer.top_k << ": max |logit diff| " << d.max_diff
                       << " of max |logit| " << d.max_abs << ", greedy " << d.same << " / "
                       << d.rows);
    return d;
}

// Bound: bf16 keeps 8 significant bits, so every cached value carries a relative rounding error
// of at most u = 2^-8. The cache feeds the scores (q·k) and the values (c_kv); to first order each
// layer's output then moves by about u relative to its size, and the four layers add up, so the
// logits may move by 4 · u · max|logit| (2^-6 relative). That holds while the indexer keeps the
// same keys: with top-k ≥ the context it keeps them all. At the preset's top-8 a rounding can
// flip a key in or out of the selection, a discrete change no rounding bound covers; there the
// test asks for the same greedy token at 90% of the steps at least.
BOOST_AUTO_TEST_CASE(bf16_cache_logits_stay_within_the_rounding_bound) {
    ModelConfig cfg = preset_config("tiny-deepseek");
    cfg.indexer.top_k = 64;  // ≥ every context below: no selection to flip
    Model dense = make_model(cfg);
    init_model_random(dense, 5);
    const Drift d = drift(dense);
    BOOST_TEST(d.max_diff > 0.0f);  // the rows were rounded
    BOOST_TEST(d.max_diff <= 4 * std::ldexp(1.0f, -8) * d.max_abs);

    Model sparse = make_model(preset_config("tiny-deepseek"));
    init_model_random(sparse, 5);
    const Drift s = drift(sparse);
    BOOST_TEST(s.same * 10 >= s.rows * 9);
}

BOOST_AUTO_TEST_CASE(latent_view_addresses_the_pool_rows) {
    const ModelConfig cfg = preset_config("tiny-deepseek");  // rows [c_kv 32 | k_r 8 | k_idx 16]
    using backend::LatentCol;
    for (DType dtype : {DType::f32, DType::bf16}) {
        KvPool pool(cfg, whole_model(cfg), 4, 8, {}, dtype);
        std::vector<int32_t> other, table;  // pages not in token order: another table first
        BOOST_REQUIRE(pool.reserve(other, 5));
        BOOST_REQUIRE(pool.reserve(table, 11));
        pool.release(other);
        BOOST_REQUIRE(pool.reserve(other, 4));  // reuses a freed page
        std::vector<void*> ptrs;
        const backend::LatentCache v = pool.latent_view(1, table, 0, 11, 32, 8, ptrs);
        BOOST_TEST(v.d_i == 16);
        BOOST_TEST(v.max_pages == 3);
        std::vector<float> in(56), out(56), got(16);
        for (int64_t u = 0; u < 11; ++u) {
            for (size_t i = 0; i < in.size(); ++i)
                in[i] = 0.37f * static_cast<float>(u) - 0.011f * static_cast<float>(i);
            backend::latent_write(v, 0, u, LatentCol::c_kv, in.data());
            backend::latent_write(v, 0, u, LatentCol::k_r, in.data() + 32);
            backend::latent_write(v, 0, u, LatentCol::k_idx, in.data() + 40);
            pool.read_row(1, table[u / 4], u % 4, 0, 56, out.data());
            for (size_t i = 0; i < in.size(); ++i) {
                const float want =
                    dtype == DType::f32 ? in[i] : bf16_to_float(float_to_bf16(in[i]));
                BOOST_TEST(out[i] == want);
            }
            backend::latent_read(v, 0, u, LatentCol::k_idx, got.data());
            BOOST_TEST(std::equal(got.begin(), got.end(), out.begin() + 40));
        }
        pool.release(table);
        pool.release(other);
    }
    std::vector<float> c_kv(2 * 3), k_r(2 * 2), k_idx;  // planar: two tokens, no indexer key
    backend::LatentCache planar;
    planar.r_kv = 3;
    planar.d_r = 2;
    planar.planes[0] = c_kv.data();
    planar.planes[1] = k_r.data();
    planar.planes[2] = k_idx.data();
    const float row[5] = {1, 2, 3, 4, 5};
    backend::latent_write(planar, 0, 1, LatentCol::c_kv, row);
    backend::latent_write(planar, 0, 1, LatentCol::k_r, row + 3);
    BOOST_TEST(c_kv == (std::vector<float>{0, 0, 0, 1, 2, 3}), boost::test_tools::per_element());
    BOOST_TEST(k_r == (std::vector<float>{0, 0, 4, 5}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_SUITE_END()
