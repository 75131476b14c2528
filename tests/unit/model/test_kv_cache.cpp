// Unit tests of the paged attention cache (hymoe/model/kv_cache.h): reserve and release keep the
// free list and the block tables disjoint and within capacity; and a DSA layer fed in chunks
// through a pool of small pages gives bit for bit the outputs of the same layer caching in its
// private arrays (paging only moves where rows live).
#include <algorithm>
#include <cstring>
#include <set>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "hymoe/core/rng.h"
#include "hymoe/model/attention.h"
#include "hymoe/model/kv_cache.h"
#include "hymoe/model/model.h"

namespace {

using namespace hymoe;
using namespace hymoe::model;

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
        attention_forward(cfg, spec, w, xs, single_sequence(len, begin), {&paged}, yp);
        attention_forward(cfg, spec, w, xs, single_sequence(len, begin), {&own}, yo);
        begin += len;
    }
    BOOST_TEST(table.size() == 10u);  // ⌈37 / 4⌉
    BOOST_TEST(std::memcmp(y_paged.ptr<float>(), y_own.ptr<float>(), y_own.view().bytes()) == 0);
}

BOOST_AUTO_TEST_SUITE_END()
