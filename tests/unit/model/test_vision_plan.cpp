// The GPU vision encoder's host index math (model/vision_plan.h) against the CPU vision path
// (model/vision.h): the pooling + merge gather rows give vision_pool then patch_merge bit for bit
// (pool 1 and 2, packed images of different grids); patch positions are (t / w, t mod w) per
// image; passes cover the images in order within the budget and take as many as fit; the heads at
// once stay in [1, H]; the cached position tables equal add_position_embedding's and are dropped
// when the cache is full.
#include <algorithm>
#include <utility>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "hymoe/core/rng.h"
#include "hymoe/model/model.h"
#include "hymoe/model/vision_plan.h"

using namespace hymoe;
using namespace hymoe::model;

BOOST_AUTO_TEST_SUITE(vision_plan)

BOOST_AUTO_TEST_CASE(gather_rows_give_pooling_and_merge_bit_for_bit) {
    const std::vector<VisionImage> images = {{4, 4, nullptr}, {8, 4, nullptr}, {4, 12, nullptr}};
    const int64_t C = 3, n = total_patches(images);
    Buffer x(DType::f32, {n, C});
    Philox rng(7, 0, 0);
    rng.fill_normal(x.ptr<float>(), static_cast<size_t>(n * C), 0.0f, 1.0f);
    for (int pool : {1, 2}) {
        const int64_t np = n / (pool * pool), g = int64_t{pool} * pool;
        Buffer pooled(DType::f32, {np, C}), merged(DType::f32, {np / 4, 4 * C});
        vision_pool(images, pool, x.view(), pooled.view());
        patch_merge(images, pool, 2, pooled.view(), merged.view());
        const std::vector<int64_t> rows = pool_merge_rows(images, pool, 2);
        BOOST_REQUIRE_EQUAL(static_cast<int64_t>(rows.size()), np * g);
        const float inv = 1.0f / static_cast<float>(g);
        for (int64_t i = 0; i < np; ++i)
            for (int64_t k = 0; k < C; ++k) {
                float acc = 0.0f;
                for (int64_t j = 0; j < g; ++j)
                    acc += x.ptr<float>()[rows[i * g + j] * C + k];
                acc *= inv;
                BOOST_TEST(acc == merged.ptr<float>()[i * C + k], "pool " << pool << " row " << i);
            }
    }
}

BOOST_AUTO_TEST_CASE(patch_positions_are_row_and_column_in_each_image) {
    const std::vector<int32_t> pos = patch_positions({{2, 3, nullptr}, {1, 2, nullptr}});
    const std::vector<int32_t> expected = {0, 0, 0, 1, 0, 2, 1, 0, 1, 1, 1, 2, 0, 0, 0, 1};
    BOOST_TEST(pos == expected, boost::test_tools::per_element());
}

// Patches 16, 16, 64, 4, 4 at 10 bytes a row: a pass costs 10·patches + 4·widest².
BOOST_AUTO_TEST_CASE(passes_cover_the_images_in_order_within_the_budget) {
    const std::vector<VisionImage> images = {
        {4, 4, nullptr}, {4, 4, nullptr}, {8, 8, nullptr}, {2, 2, nullptr}, {2, 2, nullptr}};
    auto cost = [&](const VisionPass& p) {
        int64_t n = 0, wide = 0;
        for (size_t i = p.first; i < p.first + p.count; ++i) {
            const int64_t m = images[i].grid_h * images[i].grid_w;
            n += m, wide = std::max(wide, m);
        }
        return 10 * n + 4 * wide * wide;
    };
    for (int64_t budget :
         {int64_t{1}, int64_t{1500}, int64_t{17000}, int64_t{18000}, int64_t{1} << 40}) {
        const std::vector<VisionPass> passes = vision_passes(images, 10, budget);
        size_t next = 0;
        for (size_t k = 0; k < passes.size(); ++k) {
            const VisionPass& p = passes[k];
            BOOST_TEST(p.first == next);
            BOOST_TEST(p.count >= 1u);
            BOOST_TEST((p.count == 1 || cost(p) <= budget), "budget " << budget);
            if (k + 1 < passes.size())  // greedy: the next image would not have fit
                BOOST_TEST(cost({p.first, p.count + 1}) > budget, "budget " << budget);
            next += p.count;
        }
        BOOST_TEST(next == images.size());
    }
    BOOST_TEST(vision_passes(images, 10, int64_t{1} << 40).size() == 1u);
    BOOST_TEST(vision_passes(images, 10, 1).size() == images.size());
    BOOST_TEST(vision_passes({}, 10, 100).empty());
}

BOOST_AUTO_TEST_CASE(heads_at_once_fit_the_free_bytes) {
    BOOST_TEST(vision_heads_at_once(16, 8, 0) == 1);
    BOOST_TEST(vision_heads_at_once(16, 8, 4 * 16 * 16 * 3 + 5) == 3);
    BOOST_TEST(vision_heads_at_once(16, 8, int64_t{1} << 40) == 8);
}

BOOST_AUTO_TEST_CASE(position_tables_are_add_position_embeddings_cached_by_grid) {
    Model m = make_model(preset_config("tiny"));
    init_model_random(m, 3);
    const VisionConfig& v = m.cfg.vision;
    const int64_t C = v.width;
    const int64_t one = 6 * 10 * C * 4;  // bytes of the 6×10 table
    PositionTables tables(v, m.vision, 2 * one);
    for (auto [h, w] : {std::pair<int64_t, int64_t>{6, 10}, {4, 4}, {8, 8}, {12, 2}}) {
        Buffer x(DType::f32, {h * w, C});
        add_position_embedding(v, m.vision, h, w, x.view());
        const std::vector<float>& t = tables.get(h, w);
        BOOST_TEST(t == std::vector<float>(x.ptr<float>(), x.ptr<float>() + h * w * C),
                   boost::test_tools::per_element());
    }
    const std::vector<float>* first = &tables.get(6, 10);
    BOOST_TEST(first == &tables.get(6, 10));  // kept
    BOOST_TEST(tables.kept_bytes() <= 2 * one);
}

BOOST_AUTO_TEST_SUITE_END()
