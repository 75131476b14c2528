// The GPU vision tower (label cuda; each test is a one-line skip without a GPU). Kernels
// (backend/cuda_vision.h) against the CPU's math: the bias add with both GELUs against a double
// reference, the packed 2-D RoPE against model::rope_2d image by image, the gathered means against
// model::vision_pool + patch_merge (bit for bit: the same sums in the same order). Then the GPU
// model's encode_images (model/device_model.h) against model::vision_forward on the tiny preset's
// tower with random weights (norms and biases randomised too), four images of three grid sizes in
// one batch, pool 1 and 2, in one pass and in passes of one image with one head at a time.
// Bounds. fp32: cuBLAS GEMMs without TF32 and the kernels' fp32 arithmetic differ from the CPU in
// summation order and by an ulp in tanhf / erff / exp, about 1e-6 relative a step; through two
// blocks, the merger and projector 1e-4 relative keeps a wide margin and still catches any wrong
// index, order or missing term (those give O(1) errors; the CPU tower itself matches torch to
// 4e-7). bf16: every matrix and every GEMM input (pixels included) is rounded to bf16 (2^-9
// relative), 13 GEMMs deep; a numpy emulation of that rounding on this tower's shapes and weight
// scales (not kept in the repository) gave 1.0e-3, so the bound is 1e-2.
#include <cmath>
#include <memory>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "cuda_test.h"
#include "hymoe/backend/cuda_vision.h"
#include "hymoe/model/device_model.h"
#include "hymoe/model/model.h"
#include "hymoe/model/vision.h"
#include "hymoe/model/vision_plan.h"

namespace utf = boost::unit_test;
using namespace hymoe;
using namespace hymoe::cuda_test;

namespace {

int64_t patches_of(const std::vector<model::VisionImage>& images) {
    int64_t n = 0;
    for (const model::VisionImage& im : images)
        n += im.grid_h * im.grid_w;
    return n;
}

// The tiny preset with random weights whose norms and biases are random too (init gives ones and
// zeros, which would hide a missing bias or norm weight).
model::Model vision_model() {
    model::Model m = model::make_model(model::preset_config("tiny"));
    model::init_model_random(m, 11);
    Philox rng(5, 0, 0);
    auto randomise = [&](Buffer& b, float mean) {
        rng.fill_normal(b.ptr<float>(), static_cast<size_t>(b.view().numel()), mean, 0.1f);
    };
    model::VisionWeights& w = m.vision;
    randomise(w.patch_b, 0.0f);
    for (model::VisionBlockWeights& b : w.blocks) {
        for (Buffer* bias : {&b.norm0_b, &b.wqkv_b, &b.wo_b, &b.norm1_b, &b.fc0_b, &b.fc1_b})
            randomise(*bias, 0.0f);
        randomise(b.norm0_w, 1.0f);
        randomise(b.norm1_w, 1.0f);
    }
    for (Buffer* bias : {&w.final_b, &w.proj_norm_b, &w.linear_1_b, &w.linear_2_b})
        randomise(*bias, 0.0f);
    randomise(w.final_w, 1.0f);
    randomise(w.proj_norm_w, 1.0f);
    return m;
}

// Four images (grids 4×4, 8×4, 4×12, 4×4 patches) of N(0, 0.5) pixels.
struct Images {
    std::vector<std::vector<float>> pixels;
    std::vector<model::VisionImage> list;
    explicit Images(const model::VisionConfig& v) {
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

std::unique_ptr<model::DeviceModel> device_model(const model::Model& m,
                                                 DType dtype,
                                                 int64_t vision_scratch_bytes) {
    model::DeviceModelOptions o;
    o.dtype = dtype;
    o.max_tokens = 256;
    o.max_seqs = 4;
    o.memory_fraction = 0.05;
    o.vision_scratch_bytes = vision_scratch_bytes;
    return model::make_device_model(m, o);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(cuda_vision, *utf::label("cuda"))

BOOST_AUTO_TEST_CASE(bias_add_with_tanh_and_erf_gelu, *utf::precondition(need_gpu)) {
    Gpu g;
    const int64_t n = 37, w = 50;
    const Buffer x = random({n, w}, 1, DType::f32, 2.0f), b = random({w}, 2, DType::f32);
    const Tensor db = to_device(b.view(), DType::f32, g.arena, g.s);
    for (cu::BiasAct act : {cu::BiasAct::none, cu::BiasAct::gelu_tanh, cu::BiasAct::gelu_erf}) {
        Tensor dx = to_device(x.view(), DType::f32, g.arena, g.s);
        cu::bias_act(g.s, dx, db, act);
        const Buffer got = to_host(dx, g.s);
        std::vector<float> want(static_cast<size_t>(n * w));
        for (int64_t i = 0; i < n * w; ++i) {
            const float v = x.ptr<float>()[i] + b.ptr<float>()[i % w];
            const double u = v;
            const double gelu =
                act == cu::BiasAct::gelu_tanh
                    ? 0.5 * u *
                          (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (u + 0.044715 * u * u * u)))
                    : 0.5 * u * (1.0 + std::erf(u / std::sqrt(2.0)));
            want[static_cast<size_t>(i)] = act == cu::BiasAct::none ? v : static_cast<float>(gelu);
        }
        const double e = rel_error(got.ptr<float>(), want.data(), n * w);
        BOOST_TEST_MESSAGE("bias_act " << static_cast<int>(act) << " rel err " << e);
        BOOST_TEST(e <= (act == cu::BiasAct::none ? 0.0 : 1e-6));
    }
}

// Three images' q | k | v rows (3 heads of 8): q and k turned as 6 heads in one launch.
BOOST_AUTO_TEST_CASE(rope_2d_of_a_packed_batch_of_images, *utf::precondition(need_gpu)) {
    Gpu g;
    const std::vector<model::VisionImage> images = {
        {3, 5, nullptr}, {4, 2, nullptr}, {1, 6, nullptr}};
    const int64_t H = 3, dh = 8, C = H * dh, n = patches_of(images);
    Buffer qkv = random({n, 3 * C}, 3, DType::f32);
    Tensor dev = to_device(qkv.view(), DType::f32, g.arena, g.s);
    const std::vector<int32_t> pos = model::patch_positions(images);
    const Tensor dpos = to_device_i32(pos, g.arena, g.s);
    cu::rope_2d(g.s, dev.ptr<float>(), n, 2 * H, dh, 3 * C, dpos.ptr<int32_t>());
    const Buffer got = to_host(dev, g.s);
    int64_t off = 0;
    for (const model::VisionImage& im : images) {
        float* q = qkv.ptr<float>() + off * 3 * C;
        model::rope_2d(q, im.grid_h * im.grid_w, H, dh, 3 * C, im.grid_w);
        model::rope_2d(q + C, im.grid_h * im.grid_w, H, dh, 3 * C, im.grid_w);
        off += im.grid_h * im.grid_w;
    }
    const double e = rel_error(got.ptr<float>(), qkv.ptr<float>(), n * 3 * C);
    BOOST_TEST_MESSAGE("rope_2d rel err " << e);
    BOOST_TEST(e <= 1e-6);
    for (int64_t t = 0; t < n; ++t)  // v untouched
        for (int64_t k = 2 * C; k < 3 * C; ++k)
            BOOST_TEST(got.ptr<float>()[t * 3 * C + k] == qkv.ptr<float>()[t * 3 * C + k]);
}

BOOST_AUTO_TEST_CASE(gathered_means_pool_and_merge_bit_for_bit, *utf::precondition(need_gpu)) {
    Gpu g;
    const std::vector<model::VisionImage> images = {
        {4, 4, nullptr}, {8, 4, nullptr}, {4, 12, nullptr}};
    const int64_t C = 5, n = patches_of(images);
    const Buffer x = random({n, C}, 4, DType::f32);
    const Tensor dx = to_device(x.view(), DType::f32, g.arena, g.s);
    for (int pool : {1, 2}) {
        const int64_t gsz = int64_t{pool} * pool, np = n / gsz;
        Buffer pooled(DType::f32, {np, C}), merged(DType::f32, {np / 4, 4 * C});
        model::vision_pool(images, pool, x.view(), pooled.view());
        model::patch_merge(images, pool, 2, pooled.view(), merged.view());
        Tensor idx = to_device_i64(model::pool_merge_rows(images, pool, 2), g.arena, g.s);
        idx.shape = {np, gsz};
        Tensor out = g.arena.tensor(DType::f32, {np, C});
        cu::gather_mean_rows(g.s, dx, idx, out);
        const Buffer got = to_host(out, g.s);
        for (int64_t i = 0; i < np * C; ++i)
            BOOST_TEST(got.ptr<float>()[i] == merged.ptr<float>()[i], "pool " << pool << " " << i);
    }
}

// encode_images against vision_forward: fp32 and bf16, pool 1 and 2, one pass (the step's room)
// and passes of one image, one head at a time (a 1-byte budget).
BOOST_AUTO_TEST_CASE(encoder_matches_vision_forward, *utf::precondition(need_gpu)) {
    const model::Model m = vision_model();
    const Images images(m.cfg.vision);
    const int64_t d = m.cfg.hidden_size;
    for (DType dtype : {DType::f32, DType::bf16})
        for (int64_t budget : {int64_t{0}, int64_t{1}}) {
            const std::unique_ptr<model::DeviceModel> dev = device_model(m, dtype, budget);
            for (int pool : {1, 2}) {
                const int64_t tokens =
                    model::checked_vision_tokens(m.cfg.vision, images.list, pool);
                Buffer want(DType::f32, {tokens, d}), got(DType::f32, {tokens, d});
                model::VisionStats cpu, gpu;
                model::vision_forward(m.cfg, m.vision, images.list, pool, want.view(), &cpu);
                dev->encode_images(images.list, pool, got.view(), &gpu);
                const double e = rel_error(got.ptr<float>(), want.ptr<float>(), tokens * d);
                BOOST_TEST_MESSAGE(to_string(dtype)
                                   << " budget " << budget << " pool " << pool << " rel err " << e);
                BOOST_TEST(e <= (dtype == DType::f32 ? 1e-4 : 1e-2),
                           to_string(dtype)
                               << " budget " << budget << " pool " << pool << " rel err " << e);
                BOOST_TEST(gpu.images == cpu.images);
                BOOST_TEST(gpu.patches == cpu.patches);
                BOOST_TEST(gpu.tokens == cpu.tokens);
                BOOST_TEST(gpu.flops == cpu.flops, boost::test_tools::tolerance(1e-9));
                BOOST_TEST(gpu.peak_act_bytes > 0);
            }
        }
}

BOOST_AUTO_TEST_SUITE_END()
