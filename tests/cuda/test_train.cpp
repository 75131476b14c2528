// LoRA training on the GPU (model/device_weights.h, model/lora_factors.h, model/train.h TrainOn)
// against the CPU, fp32 matrices, for each tiny preset with adapters on every target (attention
// q/k/v/o, dense and shared-expert FFNs, routed experts; B nonzero so every path carries
// gradient; dropout 0.1, the GPU drawing the CPU's masks): one pass's loss (≤ 1e-6 relative) and
// adapter gradients (≤ 1e-4 of their largest); the trainer's step over 20 steps on the device
// (the gradients zeroed there, the pass, the clipping scale from ops::sums_of_squares on the Ctx,
// AdamW on the device's factors and moments: only scalars come down) whose losses follow the same
// code on the CPU Ctx over the host slots (≤ 1e-4); a checkpoint written after step 10 (factors
// and moments brought down) and resumed into a fresh model (put back up) giving the uninterrupted
// run's losses for steps 11-20 bit for bit; and the dropout kernel's masks against the CPU's,
// bit for bit. bf16 matrices (the trainer at model.dtype bf16): one pass's loss and adapter
// gradients against the CPU pass on the same bf16-rounded weights in fp32, within the bounds
// train_setup.h derives (kBf16Loss; kBf16Grad unless a discrete choice switched).
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
#include "hymoe/backend/ops_reduce.h"
#include "hymoe/backend/ops_rows.h"
#include "hymoe/core/rng.h"
#include "hymoe/model/device_weights.h"
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

// The GPU side of a Setup: its weights uploaded (the matrices in `matrices`), its adapter as
// device factors.
struct OnGpu {
    std::unique_ptr<DeviceWeights> weights;
    std::unique_ptr<LoraFactors> factors;
    ModelViews views;
    explicit OnGpu(Setup& s, DType matrices = DType::f32)
        : weights(make_device_weights(
              s.m, Device::cuda, matrices, backend::free_device_bytes() * 3 / 10)),
          factors(std::make_unique<LoraFactors>(weights->ctx(), s.m, s.lm)),
          views(factors->attach(weights->views())) {}
    TrainOn on(const Setup& s) const { return {s.m, weights->ctx(), views}; }
};

constexpr int kSteps = 20;

deck::OptimizerSection options() {
    deck::OptimizerSection o;
    o.lr = 1e-2, o.warmup_steps = 2, o.weight_decay = 0.01, o.grad_clip = 0.5;
    return o;
}

// The lora trainer's step (runtime/lora_job.cpp, one rank) on `on` over the adapter's tensors t
// there: the gradients zeroed, the pass, the clipping scale from the global norm, AdamW on the
// Ctx. step: 1-based. Returns the loss.
double trainer_step(
    const TrainOn& on, const TrainableLora& t, runtime::AdamW& opt, const TrainBatch& b, int step) {
    for (Tensor g : t.grads)
        ops::fill_zero(on.ctx, g);
    const double loss = train_forward_backward(on, {&b, 1}, {}).loss;
    std::vector<double> squares(t.grads.size());
    ops::sums_of_squares(on.ctx, t.grads, squares);
    double sq = 0;
    for (double s : squares)
        sq += s;
    const deck::OptimizerSection o = options();
    opt.step(runtime::learning_rate(o, step - 1, kSteps),
             std::min(1.0, o.grad_clip / (std::sqrt(sq) + 1e-6)),
             step);
    return loss;
}

runtime::AdamW optimizer(const backend::Ctx& ctx, LoraModel& lm, const TrainableLora& t) {
    return runtime::AdamW(options(), ctx, lm.tensors(0), t.factors, t.grads);
}

std::vector<float> values(const TensorList& list) {
    std::vector<float> out;
    for (const TensorSpec& t : list)
        out.insert(out.end(), t.dest->ptr<float>(), t.dest->ptr<float>() + shape_numel(t.shape));
    return out;
}

void write(const TensorList& list, const std::vector<float>& v) {
    size_t at = 0;
    for (const TensorSpec& t : list) {
        std::copy_n(v.data() + at, shape_numel(t.shape), t.dest->ptr<float>());
        at += static_cast<size_t>(shape_numel(t.shape));
    }
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

BOOST_DATA_TEST_CASE(one_pass_with_bf16_weights_matches_the_cpu, data::make(kPresets), preset) {
    Setup cpu, gpu;
    make(cpu, preset, 0.1f);
    make(gpu, preset, 0.1f);
    round_matrices(cpu.m);  // the CPU's fp32 twin of the bf16 upload
    const TrainBatch b = two_docs(cpu.m.cfg.vocab_size);
    std::vector<std::vector<int64_t>> cpu_load = no_load(cpu.m), gpu_load = no_load(gpu.m);
    TrainOptions o;
    o.expert_load = &cpu_load;
    zero(cpu.lm);
    const LossSums want = train_forward_backward(cpu.m, b, o);
    OnGpu dev(gpu, DType::bf16);
    // the matrices held in bf16, the vectors and the router in fp32, the experts reading fp32
    const ModelViews& v = dev.weights->views();
    BOOST_TEST((v.head.dtype == DType::bf16 && v.final_norm.dtype == DType::f32));
    for (const LayerViews& l : v.layers)
        if (!l.moe.experts.up.empty())
            BOOST_TEST((l.moe.experts.up.front().dtype == DType::bf16 &&
                        l.moe.router.dtype == DType::f32 && l.moe.act == DType::f32));
    zero(gpu.lm);
    o.expert_load = &gpu_load;
    const LossSums got = train_forward_backward(dev.on(gpu), {&b, 1}, o);
    dev.factors->download_grads();
    const std::vector<float> g = grads(gpu.lm), w = grads(cpu.lm);
    BOOST_REQUIRE_EQUAL(g.size(), w.size());
    const double loss_diff = std::abs(got.loss - want.loss) / want.loss;
    const double grad_diff = max_abs_rel(g, w);
    const bool same_load = gpu_load == cpu_load;
    BOOST_TEST_MESSAGE(preset << ": bf16 weights, " << dev.weights->weight_bytes()
                              << " bytes; loss " << loss_diff << ", gradients " << grad_diff
                              << (same_load ? "" : " (a token's experts switched)"));
    BOOST_TEST(loss_diff <= kBf16Loss);
    BOOST_TEST(got.targets == want.targets);
    BOOST_TEST(grad_diff <= bf16_grad_bound(preset, same_load));
}

BOOST_DATA_TEST_CASE(twenty_steps_follow_the_cpu, data::make(kPresets), preset) {
    Setup cpu, gpu;
    make(cpu, preset, 0.1f);
    make(gpu, preset, 0.1f);
    const TrainBatch b = two_docs(cpu.m.cfg.vocab_size);
    const ModelViews host = host_views(cpu.m);
    const TrainOn on_cpu{cpu.m, cpu.m.ctx, host};
    const TrainableLora t_cpu = host_trainable(cpu.lm);
    runtime::AdamW opt_cpu = optimizer(cpu.m.ctx, cpu.lm, t_cpu);
    OnGpu dev(gpu);
    const TrainableLora t_gpu = dev.factors->trainable();
    runtime::AdamW opt_gpu = optimizer(dev.weights->ctx(), gpu.lm, t_gpu);
    const std::vector<float> host_before = values(gpu.lm.tensors(0));
    double worst = 0;
    for (int step = 1; step <= kSteps; ++step) {
        const double want = trainer_step(on_cpu, t_cpu, opt_cpu, b, step);
        const double got = trainer_step(dev.on(gpu), t_gpu, opt_gpu, b, step);
        worst = std::max(worst, std::abs(got - want) / want);
    }
    BOOST_TEST_MESSAGE(preset << ": 20 steps, worst loss difference " << worst);
    BOOST_TEST(worst <= 1e-4);
    // the device was the state of record: the host slots never moved until brought down
    BOOST_TEST((values(gpu.lm.tensors(0)) == host_before));
    dev.factors->download_factors();
    opt_gpu.download_state();
    // the moments follow the gradients; the factors to 1e-2 as in the lora_job suite (AdamW
    // divides each element by its own gradient scale, so near-zero gradients move by up to lr)
    BOOST_TEST(max_abs_rel(values(opt_gpu.state()), values(opt_cpu.state())) <= 1e-3);
    BOOST_TEST(max_abs_rel(values(gpu.lm.tensors(0)), values(cpu.lm.tensors(0))) <= 1e-2);
}

BOOST_DATA_TEST_CASE(a_checkpoint_mid_run_resumes_to_the_same_losses,
                     data::make(kPresets),
                     preset) {
    Setup whole, resumed;
    make(whole, preset, 0.1f);
    make(resumed, preset, 0.1f);
    const TrainBatch b = two_docs(whole.m.cfg.vocab_size);
    OnGpu dev(whole);
    const TrainableLora t = dev.factors->trainable();
    runtime::AdamW opt = optimizer(dev.weights->ctx(), whole.lm, t);
    std::vector<double> want;
    std::vector<float> factors, moments;  // the checkpoint after step 10
    for (int step = 1; step <= kSteps; ++step) {
        want.push_back(trainer_step(dev.on(whole), t, opt, b, step));
        if (step != kSteps / 2)
            continue;
        dev.factors->download_factors();
        opt.download_state();
        factors = values(whole.lm.tensors(0));
        moments = values(opt.state());
    }
    write(resumed.lm.tensors(0), factors);  // loaded into the host slots, then put up
    OnGpu again(resumed);
    const TrainableLora t2 = again.factors->trainable();
    runtime::AdamW opt2 = optimizer(again.weights->ctx(), resumed.lm, t2);
    write(opt2.state(), moments);
    opt2.upload_state();
    for (int step = kSteps / 2 + 1; step <= kSteps; ++step) {
        const double got = trainer_step(again.on(resumed), t2, opt2, b, step);
        BOOST_TEST(got == want[static_cast<size_t>(step - 1)]);
    }
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
