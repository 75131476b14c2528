// LoRA training on the GPU (model/gpu_weights.h, model/lora_factors.h, model/train.h TrainOn)
// against the CPU, fp32 matrices, for each tiny preset with adapters on every target (attention
// q/k/v/o, dense and shared-expert FFNs, routed experts; B nonzero so every path carries
// gradient; dropout 0.1, the GPU drawing the CPU's masks): one pass's loss (≤ 1e-6 relative) and
// adapter gradients (≤ 1e-4 of their largest), and the trainer's loop over 20 AdamW steps (the
// GPU's gradients brought down, the update on the host, the factors put back up) whose losses
// follow the CPU run's (≤ 1e-4); and the dropout kernel's masks against the CPU's, bit for bit.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include "../unit/model/train_setup.h"
#include "cuda_test.h"
#include "hymoe/backend/device.h"
#include "hymoe/backend/ops_dropout.h"
#include "hymoe/backend/ops_rows.h"
#include "hymoe/core/rng.h"
#include "hymoe/model/gpu_weights.h"
#include "hymoe/model/lora_factors.h"
#include "hymoe/model/lora_model.h"
#include "hymoe/model/train.h"
#include "hymoe/runtime/optimizer.h"

namespace data = boost::unit_test::data;
namespace utf = boost::unit_test;
using namespace hymoe;
using namespace hymoe::model;
using hymoe::cuda_test::need_gpu;
using namespace hymoe::train_test;

namespace {

// The GPU side of a Setup: its weights uploaded, its adapter as device factors.
struct OnGpu {
    std::unique_ptr<GpuWeights> weights;
    std::unique_ptr<LoraFactors> factors;
    ModelViews views;
    explicit OnGpu(Setup& s)
        : weights(make_gpu_weights(s.m, DType::f32, backend::free_device_bytes() * 3 / 10)),
          factors(std::make_unique<LoraFactors>(weights->ctx(), s.m, s.lm)),
          views(factors->attach(weights->views())) {}
    TrainOn on(const Setup& s) const { return {s.m, weights->ctx(), views}; }
};

double max_abs_rel(const std::vector<float>& got, const std::vector<float>& want) {
    double diff = 0, scale = 0;
    for (size_t i = 0; i < want.size(); ++i) {
        diff = std::max(diff, static_cast<double>(std::abs(got[i] - want[i])));
        scale = std::max(scale, static_cast<double>(std::abs(want[i])));
    }
    return diff / scale;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(cuda_train, *utf::label("cuda") * utf::precondition(need_gpu))

BOOST_DATA_TEST_CASE(one_pass_matches_the_cpu, data::make(kPresets), preset) {
    Setup cpu, gpu;
    make(cpu, preset, 0.1f);
    make(gpu, preset, 0.1f);
    const TrainBatch b = two_docs(cpu.m.cfg.vocab_size);
    zero(cpu.lm);
    const LossSums want = train_forward_backward(cpu.m, b, {});
    OnGpu dev(gpu);
    zero(gpu.lm);
    const LossSums got = train_forward_backward(dev.on(gpu), {&b, 1}, {});
    dev.factors->download_grads();
    BOOST_TEST(std::abs(got.loss - want.loss) <= 1e-6 * want.loss);
    BOOST_TEST(got.targets == want.targets);
    BOOST_TEST(got.correct == want.correct);
    const std::vector<float> g = grads(gpu.lm), w = grads(cpu.lm);
    BOOST_REQUIRE_EQUAL(g.size(), w.size());
    BOOST_TEST(max_abs_rel(g, w) <= 1e-4);
}

BOOST_DATA_TEST_CASE(twenty_steps_follow_the_cpu, data::make(kPresets), preset) {
    Setup cpu, gpu;
    make(cpu, preset, 0.1f);
    make(gpu, preset, 0.1f);
    const TrainBatch b = two_docs(cpu.m.cfg.vocab_size);
    deck::OptimizerSection o;
    o.lr = 1e-2;
    runtime::AdamW opt_cpu(o, cpu.lm.tensors(0), cpu.lm.tensors(0, true));
    runtime::AdamW opt_gpu(o, gpu.lm.tensors(0), gpu.lm.tensors(0, true));
    OnGpu dev(gpu);
    double worst = 0;
    for (int step = 1; step <= 20; ++step) {
        zero(cpu.lm);
        const double want = train_forward_backward(cpu.m, b, {}).loss;
        opt_cpu.step(o.lr, 1.0, step);
        zero(gpu.lm);
        dev.factors->zero_grads();
        const double got = train_forward_backward(dev.on(gpu), {&b, 1}, {}).loss;
        dev.factors->download_grads();
        opt_gpu.step(o.lr, 1.0, step);
        dev.factors->upload_factors();
        worst = std::max(worst, std::abs(got - want) / want);
    }
    BOOST_TEST_MESSAGE(preset << ": 20 steps, worst loss difference " << worst);
    BOOST_TEST(worst <= 1e-4);
}

BOOST_AUTO_TEST_CASE(dropout_masks_are_the_cpus) {
    const int64_t n = 37, in = 301;  // rows and a width that is no multiple of 4
    Buffer x(DType::f32, {n, in}), want(DType::f32, {n, in}), got(DType::f32, {n, in});
    Philox(3, 0, 0).fill_normal(x.ptr<float>(), static_cast<size_t>(n * in), 0, 1);
    const ops::DropoutKey key{0.3f, 0x123456789abcull, 77};
    ops::dropout_rows(x.view(), key, want.view());
    hymoe::cuda_test::GpuCtx g;
    const Tensor dx = g.up(x);
    Tensor dy = g.f32({n, in});
    ops::dropout_rows(g.ctx, dx, key, dy);
    ops::download(g.ctx, dy, got.view());
    BOOST_TEST(std::memcmp(got.view().data, want.view().data, want.view().bytes()) == 0);
}

BOOST_AUTO_TEST_SUITE_END()
