// The one vision forward on views (hymoe/model/vision_views.h) on a CPU context: the views are
// bound by walking vision_tensors' list (every field the Buffer the list names at its place; a
// device's mapped copies each made from the Buffer its spec names), a list of the wrong length is
// refused, and the forward in passes of one image with one head at a
// time gives the one-pass tokens bit for bit, with the same figures and the GEMM FLOPs the CPU's
// counter saw.
#include <map>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "hymoe/backend/ops.h"
#include "hymoe/core/error.h"
#include "hymoe/core/rng.h"
#include "hymoe/model/model.h"
#include "hymoe/model/vision_views.h"

namespace {

using namespace hymoe;
using namespace hymoe::model;

// Four images (grids 4×4, 8×4, 4×12, 4×4) of N(0, 0.5) pixels.
struct Images {
    std::vector<std::vector<float>> pixels;
    std::vector<VisionImage> list;
    explicit Images(const VisionConfig& v) {
        const int64_t grids[4][2] = {{4, 4}, {8, 4}, {4, 12}, {4, 4}};
        Philox rng(17, 0, 0);
        for (const auto& g : grids) {
            const int64_t p = v.patch_size;
            pixels.emplace_back(static_cast<size_t>(3 * g[0] * p * g[1] * p));
            rng.fill_normal(pixels.back().data(), pixels.back().size(), 0.0f, 0.5f);
        }
        for (size_t i = 0; i < 4; ++i)
            list.push_back({grids[i][0], grids[i][1], pixels[i].data()});
    }
};

}  // namespace

BOOST_AUTO_TEST_SUITE(vision_views)

BOOST_AUTO_TEST_CASE(views_are_bound_by_the_weight_list) {
    Model m = make_model(preset_config("tiny"));
    init_model_random(m, 3);
    const TensorList list = vision_tensors(m.cfg, m.vision);
    const std::vector<const Buffer*> order = vision_list(m.cfg, m.vision);
    BOOST_REQUIRE(order.size() == list.size());
    std::vector<Tensor> tensors;
    for (size_t i = 0; i < list.size(); ++i) {
        BOOST_TEST(order[i] == list[i].dest, list[i].name);
        tensors.push_back(list[i].dest->view());
    }
    const VisionWeightViews w = model::vision_views(m.cfg, tensors);
    const VisionWeights& h = m.vision;
    BOOST_TEST(w.patch_w.data == h.patch_w.view().data);
    BOOST_TEST(w.pos_emb.data == h.pos_emb.view().data);
    BOOST_TEST(w.linear_2_b.data == h.linear_2_b.view().data);
    BOOST_REQUIRE(w.blocks.size() == h.blocks.size());
    const size_t last = h.blocks.size() - 1;
    BOOST_TEST(w.blocks[last].wqkv_b.data == h.blocks[last].wqkv_b.view().data);
    BOOST_TEST(w.blocks[last].fc1_w.data == h.blocks[last].fc1_w.view().data);
    const VisionBlockViews b = vision_block_views(m.cfg.vision, h.blocks[0]);
    BOOST_TEST(b.norm1_b.data == h.blocks[0].norm1_b.view().data);
    BOOST_TEST(b.fc0_w.data == h.blocks[0].fc0_w.view().data);
    tensors.pop_back();
    BOOST_CHECK_THROW(model::vision_views(m.cfg, tensors), Error);
}

// The form a device builds its copies with: f sees each spec with the Buffer the bound list names.
BOOST_AUTO_TEST_CASE(mapped_views_pair_each_spec_with_its_buffer) {
    Model m = make_model(preset_config("tiny"));
    init_model_random(m, 3);
    std::map<std::string, const Buffer*> bound;
    for (const TensorSpec& spec : vision_tensors(m.cfg, m.vision))
        bound[spec.name] = spec.dest;
    std::vector<Buffer> copies;
    copies.reserve(bound.size());
    const VisionWeightViews w =
        model::vision_views(m.cfg, m.vision, [&](const TensorSpec& spec, const Buffer& b) {
            BOOST_TEST(bound.at(spec.name) == &b, spec.name);
            BOOST_TEST(spec.shape == b.view().shape, spec.name);
            return copies.emplace_back(DType::f32, spec.shape).view();
        });
    BOOST_TEST(copies.size() == bound.size());
    BOOST_TEST(w.patch_w.data == copies.front().view().data);
    BOOST_TEST(w.linear_2_b.data == copies.back().view().data);
    BOOST_TEST(w.blocks[0].norm0_w.data == copies[3].view().data);  // after the patch embedding
}

BOOST_AUTO_TEST_CASE(passes_of_one_image_give_the_one_pass_tokens_bit_for_bit) {
    Model m = make_model(preset_config("tiny"));
    init_model_random(m, 11);
    const Images images(m.cfg.vision);
    const int64_t d = m.cfg.hidden_size;
    const VisionWeightViews w = model::vision_views(m.cfg, m.vision);
    PositionTables positions(m.cfg.vision, m.vision, 0);
    // rows independent of what shares a GEMM (ops.h set_batch_invariant), as passes need
    struct Invariant {
        Invariant() { ops::set_batch_invariant(true); }
        ~Invariant() { ops::set_batch_invariant(false); }
    };
    for (int pool : {1, 2}) {
        const int64_t tokens = checked_vision_tokens(m.cfg.vision, images.list, pool);
        Buffer one(DType::f32, {tokens, d}), split(DType::f32, {tokens, d});
        VisionStats a, b;
        // the counter sees each product's 2·m·n·k (batch invariance may pad rows: not here)
        const double f0 = ops::gemm_counter().flops;
        vision_forward(m.cfg, m.vision, images.list, pool, one.view(), &a);
        const double counted = ops::gemm_counter().flops - f0;
        {
            const Invariant invariant;
            vision_forward(m.cfg, m.vision, images.list, pool, one.view());
            vision_forward(
                backend::cpu_ctx(), m.cfg, w, positions, images.list, pool, 1, split.view(), &b);
        }
        for (int64_t i = 0; i < tokens * d; ++i)
            BOOST_TEST(one.ptr<float>()[i] == split.ptr<float>()[i], "pool " << pool << " " << i);
        BOOST_TEST(a.images == 4);
        BOOST_TEST(b.images == 4);
        BOOST_TEST(a.patches == b.patches);
        BOOST_TEST(a.tokens == tokens);
        BOOST_TEST(b.tokens == tokens);
        BOOST_TEST(a.flops == counted);
        BOOST_TEST(b.flops == counted);
        BOOST_TEST(a.peak_act_bytes > b.peak_act_bytes);  // one pass holds every image
    }
}

BOOST_AUTO_TEST_SUITE_END()
