// Unit tests of the vision path (hymoe/model/vision.h, spec/model-math.md §8): patch ordering,
// 2×2 merge ordering and pooling against hand cases; the 2-D RoPE's pair/axis assignment by hand;
// bicubic resampling's identity and constant cases; and the torch golden of
// tests/golden/gen_vision.py (patch embedding + interpolated positions, one ViT block, the whole
// tower, the merger and the projector on two packed images of different sizes). A splice through
// the model's forward equals overwriting embedding rows by hand. Run from the repository root.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "hymoe/backend/ops.h"
#include "hymoe/backend/resize.h"
#include "hymoe/io/h5.h"
#include "hymoe/model/model.h"
#include "hymoe/model/vision.h"

namespace {

using namespace hymoe;
using namespace hymoe::model;

// max |a − b| / max |b|
double rel_err(const float* a, const std::vector<float>& b) {
    double num = 0, den = 0;
    for (size_t i = 0; i < b.size(); ++i) {
        num = std::max(num, static_cast<double>(std::fabs(a[i] - b[i])));
        den = std::max(den, static_cast<double>(std::fabs(b[i])));
    }
    return num / den;
}

struct Golden {
    io::H5Reader h5{"tests/golden/vision.h5"};
    ModelConfig cfg = preset_config("tiny");
    VisionWeights w;
    std::vector<std::vector<float>> pixels;
    std::vector<VisionImage> images;
    double rtol = h5.floats("rtol")[0];
    Golden() {
        load_named(vision_tensors(cfg, w), "weights/", [&](const std::string& name, Tensor& d) {
            BOOST_REQUIRE_MESSAGE(h5.shape(name) == d.shape, name);
            const std::vector<float> v = h5.floats(name);
            std::copy(v.begin(), v.end(), d.ptr<float>());
        });
        const std::vector<int64_t> g = h5.ints("grids");
        pixels.resize(g.size() / 2);
        for (size_t i = 0; i < pixels.size(); ++i)
            pixels[i] = h5.floats("pixels_" + std::to_string(i));
        for (size_t i = 0; i < pixels.size(); ++i)
            images.push_back({g[2 * i], g[2 * i + 1], pixels[i].data()});
    }
    int64_t patches() const {
        int64_t n = 0;
        for (const VisionImage& im : images)
            n += im.grid_h * im.grid_w;
        return n;
    }
    // x [L, C] after the patch embedding and positions
    Buffer embed() const {
        const VisionConfig& v = cfg.vision;
        const int64_t p = v.patch_size, C = v.width, n = patches();
        Buffer patch(DType::f32, {n, 3 * p * p}), x(DType::f32, {n, C});
        patchify(v, images, patch.view());
        Tensor wp = w.patch_w.view();
        wp.shape = {C, 3 * p * p};
        ops::linear(patch.view(), wp, x.view());
        int64_t off = 0;
        for (const VisionImage& im : images) {
            Tensor rows = x.view().rows(off, im.grid_h * im.grid_w);
            for (int64_t r = 0; r < rows.dim(0); ++r)
                for (int64_t k = 0; k < C; ++k)
                    rows.ptr<float>()[r * C + k] += w.patch_b.ptr<float>()[k];
            add_position_embedding(v, w, im.grid_h, im.grid_w, rows);
            off += rows.dim(0);
        }
        return x;
    }
};

}  // namespace

BOOST_AUTO_TEST_SUITE(vision)

// A 2×3-patch image of p = 2 whose pixel (c, y, x) holds 100c + 10y + x: patch t = (gy, gx)
// row-major, inside it (c, ky, kx) channel-major.
BOOST_AUTO_TEST_CASE(patches_are_row_major_and_channel_major_inside) {
    VisionConfig v;
    v.patch_size = 2;
    const int64_t gh = 2, gw = 3, H = 4, W = 6;
    std::vector<float> px(3 * H * W);
    for (int c = 0; c < 3; ++c)
        for (int y = 0; y < H; ++y)
            for (int x = 0; x < W; ++x)
                px[(c * H + y) * W + x] = static_cast<float>(100 * c + 10 * y + x);
    Buffer out(DType::f32, {gh * gw, 12});
    patchify(v, {{gh, gw, px.data()}}, out.view());
    // patch 4 = (gy 1, gx 1): pixels y 2..3, x 2..3
    const std::vector<float> p4 = {22, 23, 32, 33, 122, 123, 132, 133, 222, 223, 232, 233};
    BOOST_TEST(std::vector<float>(out.ptr<float>() + 4 * 12, out.ptr<float>() + 5 * 12) == p4,
               boost::test_tools::per_element());
    const std::vector<float> p2 = {4, 5, 14, 15, 104, 105, 114, 115, 204, 205, 214, 215};
    BOOST_TEST(std::vector<float>(out.ptr<float>() + 2 * 12, out.ptr<float>() + 3 * 12) == p2,
               boost::test_tools::per_element());
}

// Two images, 4×4 then 2×2 patches, x[t] = t (C = 1): merged cells row-major per image, inside a
// cell (ih, iw) row-major, the second image after the first.
BOOST_AUTO_TEST_CASE(merge_orders_cells_and_slots_by_hand) {
    std::vector<VisionImage> images = {{4, 4, nullptr}, {2, 2, nullptr}};
    Buffer x(DType::f32, {20, 1}), out(DType::f32, {5, 4});
    for (int t = 0; t < 20; ++t)
        x.ptr<float>()[t] = static_cast<float>(t);
    patch_merge(images, 1, 2, x.view(), out.view());
    const std::vector<float> expected = {0,  1,  4,  5,  2,  3,  6,  7,  8,  9,
                                         12, 13, 10, 11, 14, 15, 16, 17, 18, 19};
    BOOST_TEST(std::vector<float>(out.ptr<float>(), out.ptr<float>() + 20) == expected,
               boost::test_tools::per_element());
}

// pool 2 on a 4×4 grid: means of the four 2×2 cells, row-major; then one merged token of all four.
BOOST_AUTO_TEST_CASE(pooling_averages_cells_by_hand) {
    std::vector<VisionImage> images = {{4, 4, nullptr}};
    Buffer x(DType::f32, {16, 1}), pooled(DType::f32, {4, 1}), merged(DType::f32, {1, 4});
    for (int t = 0; t < 16; ++t)
        x.ptr<float>()[t] = static_cast<float>(t);
    vision_pool(images, 2, x.view(), pooled.view());
    const std::vector<float> expected = {2.5f, 4.5f, 10.5f, 12.5f};  // (0+1+4+5)/4, ...
    BOOST_TEST(std::vector<float>(pooled.ptr<float>(), pooled.ptr<float>() + 4) == expected,
               boost::test_tools::per_element());
    patch_merge(images, 2, 2, pooled.view(), merged.view());
    BOOST_TEST(std::vector<float>(merged.ptr<float>(), merged.ptr<float>() + 4) == expected,
               boost::test_tools::per_element());
    VisionConfig v;
    BOOST_TEST(vision_tokens(v, 8, 12, 2) == 6);
    BOOST_TEST(vision_tokens(v, 8, 12, 1) == 24);
}

// dh = 8, one head, patch 5 of a grid 3 wide = (row 1, col 2); every pair starts at (1, 0):
// pair 0 turns by col·θ0 = 2, pair 1 by row·θ0 = 1, pair 2 by col·θ1, pair 3 by row·θ1,
// θ1 = 10000^{-4/8} = 0.01.
BOOST_AUTO_TEST_CASE(rope_2d_rotates_even_pairs_by_column_odd_by_row) {
    std::vector<float> x(6 * 8, 0.0f);
    for (int t = 0; t < 6; ++t)
        for (int j = 0; j < 4; ++j)
            x[t * 8 + 2 * j] = 1.0f;
    rope_2d(x.data(), 6, 1, 8, 8, 3);
    const float angles[4] = {2.0f, 1.0f, 0.02f, 0.01f};
    for (int j = 0; j < 4; ++j) {
        BOOST_TEST(x[5 * 8 + 2 * j] == std::cos(angles[j]), boost::test_tools::tolerance(1e-6f));
        BOOST_TEST(x[5 * 8 + 2 * j + 1] == std::sin(angles[j]),
                   boost::test_tools::tolerance(1e-6f));
    }
    BOOST_TEST(x[0] == 1.0f);  // patch 0 at (0, 0): unrotated
    BOOST_TEST(x[1] == 0.0f);
}

BOOST_AUTO_TEST_CASE(bicubic_copies_at_the_same_size_and_keeps_constants) {
    std::vector<float> src(5 * 7 * 2), same(src.size()), big(11 * 3 * 2);
    for (size_t i = 0; i < src.size(); ++i)
        src[i] = static_cast<float>((i * 37) % 11) - 5.0f;
    ops::resize_bicubic(src.data(), 5, 7, 2, same.data(), 5, 7);
    BOOST_TEST(same == src, boost::test_tools::per_element());
    std::fill(src.begin(), src.end(), 3.0f);
    ops::resize_bicubic(src.data(), 5, 7, 2, big.data(), 11, 3);
    for (float b : big)
        BOOST_TEST(b == 3.0f, boost::test_tools::tolerance(1e-6f));
}

// torch golden: patch embedding + bicubic positions (down 8→4,6 and up 8→10), one block.
BOOST_AUTO_TEST_CASE(embedding_and_one_block_match_torch) {
    Golden g;
    Buffer x = g.embed();
    const double e0 = rel_err(x.ptr<float>(), g.h5.floats("x_embed"));
    BOOST_TEST_MESSAGE("x_embed rel err " << e0);
    BOOST_TEST(e0 <= g.rtol, "x_embed rel err " << e0);
    vision_block(g.cfg.vision, g.w.blocks[0], g.images, x.view());
    const double e1 = rel_err(x.ptr<float>(), g.h5.floats("x_block0"));
    BOOST_TEST_MESSAGE("x_block0 rel err " << e1);
    BOOST_TEST(e1 <= g.rtol, "x_block0 rel err " << e1);
}

// The projector alone on torch's merged rows, the merger on torch's tower output, and the whole
// vision_forward on the pixels.
BOOST_AUTO_TEST_CASE(merger_projector_and_whole_tower_match_torch) {
    Golden g;
    const int64_t C = g.cfg.vision.width, d = g.cfg.hidden_size, L = g.patches(), N = L / 4;
    std::vector<float> fin = g.h5.floats("x_final"), mer = g.h5.floats("merged");
    const std::vector<float> tok = g.h5.floats("tokens");
    Tensor xf{fin.data(), DType::f32, Device::cpu, {L, C}};
    Buffer merged(DType::f32, {N, 4 * C}), out(DType::f32, {N, d});
    patch_merge(g.images, 1, 2, xf, merged.view());
    BOOST_TEST(rel_err(merged.ptr<float>(), mer) == 0.0);  // a permutation: exact
    Tensor mt{mer.data(), DType::f32, Device::cpu, {N, 4 * C}};
    vision_project(g.cfg.vision, g.w, mt, out.view());
    const double ep = rel_err(out.ptr<float>(), tok);
    BOOST_TEST_MESSAGE("projector rel err " << ep);
    BOOST_TEST(ep <= g.rtol, "projector rel err " << ep);
    Buffer all(DType::f32, {N, d});
    VisionStats stats;
    vision_forward(g.cfg, g.w, g.images, 1, all.view(), &stats);
    const double ea = rel_err(all.ptr<float>(), tok);
    BOOST_TEST_MESSAGE("tower rel err " << ea);
    BOOST_TEST(ea <= g.rtol, "tower rel err " << ea);
    BOOST_TEST(stats.images == 2);
    BOOST_TEST(stats.patches == L);
    BOOST_TEST(stats.tokens == N);
    BOOST_TEST(stats.flops > 0);
}

// Packing: each image encoded alone gives the same tokens as both packed together (attention
// never crosses images).
BOOST_AUTO_TEST_CASE(packed_images_equal_images_alone) {
    Golden g;
    const int64_t d = g.cfg.hidden_size;
    const int64_t n0 = vision_tokens(g.cfg.vision, g.images[0].grid_h, g.images[0].grid_w, 1);
    const int64_t n1 = vision_tokens(g.cfg.vision, g.images[1].grid_h, g.images[1].grid_w, 1);
    Buffer both(DType::f32, {n0 + n1, d}), a(DType::f32, {n0, d}), b(DType::f32, {n1, d});
    vision_forward(g.cfg, g.w, g.images, 1, both.view());
    vision_forward(g.cfg, g.w, {g.images[0]}, 1, a.view());
    vision_forward(g.cfg, g.w, {g.images[1]}, 1, b.view());
    std::vector<float> ab(a.ptr<float>(), a.ptr<float>() + n0 * d);
    ab.insert(ab.end(), b.ptr<float>(), b.ptr<float>() + n1 * d);
    BOOST_TEST(rel_err(both.ptr<float>(), ab) <= 1e-6);
}

// forward with a MediaSplice equals forward on hand-overwritten embeddings: run the tiny model's
// first layers on embeddings built by hand (rows replaced) vs on the splice, compare logits.
BOOST_AUTO_TEST_CASE(splice_replaces_the_placeholder_rows) {
    ModelConfig cfg = preset_config("tiny");
    Model m = make_model(cfg);
    init_model_random(m, 7);
    const int64_t d = cfg.hidden_size, mid = cfg.vision.media_token_id;
    const std::vector<int64_t> tokens = {1, mid, mid, 9, mid, 12};
    MediaSplice media;
    media.rows = {1, 2, 4};
    media.embeds = Buffer(DType::f32, {3, d});
    for (int64_t i = 0; i < 3 * d; ++i)
        media.embeds.ptr<float>()[i] = std::sin(0.37f * static_cast<float>(i));
    SequenceState s1 = make_sequence_state(m), s2 = make_sequence_state(m);
    Buffer with, plain;
    ForwardOptions fo;
    fo.media = &media;
    // Batch-invariant products: row 0's expert GEMMs share their call with other rows whose
    // routing the splice changes, and BLAS may round a row with the call's row count.
    ops::set_batch_invariant(true);
    forward(m, tokens, single_sequence(6, 0), {&s1}, with, fo);
    forward(m, tokens, single_sequence(6, 0), {&s2}, plain);
    // by hand: the placeholder's embedding row swapped for each image row changes the logits
    // from the first spliced row on, and not before it
    const int64_t V = cfg.vocab_size;
    BOOST_TEST(std::equal(with.ptr<float>(), with.ptr<float>() + V, plain.ptr<float>()));
    BOOST_TEST(
        !std::equal(with.ptr<float>() + V, with.ptr<float>() + 2 * V, plain.ptr<float>() + V));
    // and equals a model whose embedding table holds the image rows under fresh ids
    Model h = make_model(cfg);
    init_model_random(h, 7);
    std::vector<int64_t> ids = tokens;
    const int64_t spare[3] = {250, 251, 252};
    for (int i = 0; i < 3; ++i) {
        std::copy_n(media.embeds.ptr<float>() + i * d, d, h.embed.ptr<float>() + spare[i] * d);
        ids[media.rows[i]] = spare[i];
    }
    SequenceState s3 = make_sequence_state(h);
    Buffer by_hand;
    forward(h, ids, single_sequence(6, 0), {&s3}, by_hand);
    ops::set_batch_invariant(false);
    BOOST_TEST(std::equal(with.ptr<float>(), with.ptr<float>() + 6 * V, by_hand.ptr<float>()));
}

BOOST_AUTO_TEST_SUITE_END()
