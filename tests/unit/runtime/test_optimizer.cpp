// The LoRA trainer's AdamW (runtime/optimizer.h) on a CPU Ctx over a LoRA model's host slots (the
// CPU trainer's tensors, model/lora_factors.h host_trainable): five updates (warmup and cosine
// learning rates, a clipping scale, weight decay) give parameters and moments bit-identical to
// ops::adamw's CPU form on host Buffers (the update before it ran on a Ctx); an optimizer rebuilt
// from its checkpointed moments (state(), then upload_state) continues bit for bit; the trainable
// tensors are the host slots in lm.tensors(0) order, and a CPU-Ctx LoraFactors brings its factors
// down into them (download_factors).
#include <cmath>
#include <cstring>
#include <vector>

#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include "../model/train_setup.h"
#include "hymoe/backend/ops_backward.h"
#include "hymoe/core/rng.h"
#include "hymoe/model/lora_factors.h"
#include "hymoe/runtime/optimizer.h"

namespace data = boost::unit_test::data;
using namespace hymoe;
using namespace hymoe::train_test;

namespace {

deck::OptimizerSection options() {
    deck::OptimizerSection o;
    o.lr = 1e-2, o.warmup_steps = 2, o.weight_decay = 0.01, o.beta2 = 0.95;
    return o;
}

constexpr int64_t kSteps = 5;

// Step t's gradients (1-based) into the host slots' dA, dB.
void fill_grads(LoraModel& lm, int t) {
    Philox rng(21, static_cast<uint32_t>(t), 0);
    for (const TensorSpec& g : lm.tensors(0, true))
        rng.fill_normal(g.dest->ptr<float>(), static_cast<size_t>(shape_numel(g.shape)), 0, 1e-2f);
}

// The learning rate and clipping scale of step t (1-based).
double lr_of(int t) {
    return runtime::learning_rate(options(), t - 1, kSteps);
}
double clip_of(int t) {
    return t == 3 ? 0.25 : 1.0;
}

std::vector<float> values(const TensorList& list) {
    std::vector<float> out;
    for (const TensorSpec& t : list)
        out.insert(out.end(), t.dest->ptr<float>(), t.dest->ptr<float>() + shape_numel(t.shape));
    return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

runtime::AdamW optimizer_of(Setup& s, const backend::Ctx& ctx) {
    const TrainableLora t = host_trainable(s.lm);
    return runtime::AdamW(options(), ctx, s.lm.tensors(0), t.factors, t.grads);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(optimizer)

BOOST_DATA_TEST_CASE(cpu_ctx_update_is_the_host_form_bit_for_bit, data::make(kPresets), preset) {
    Setup got, want;
    make(got, preset, 0.0f);
    make(want, preset, 0.0f);
    runtime::AdamW opt = optimizer_of(got, backend::cpu_ctx());
    // the host form: ops::adamw's CPU form over the host slots and host moments
    const TensorList wp = want.lm.tensors(0), wg = want.lm.tensors(0, true);
    std::vector<Buffer> wm, wv;
    for (const TensorSpec& p : wp)
        wm.emplace_back(DType::f32, p.shape), wv.emplace_back(DType::f32, p.shape);
    const deck::OptimizerSection o = options();
    for (int t = 1; t <= kSteps; ++t) {
        fill_grads(got.lm, t);
        fill_grads(want.lm, t);
        opt.step(lr_of(t), clip_of(t), t);
        ops::AdamWStep s;
        s.lr = lr_of(t), s.beta1 = o.beta1, s.beta2 = o.beta2, s.eps = o.eps;
        s.weight_decay = o.weight_decay, s.grad_scale = clip_of(t);
        s.c1 = 1.0 - std::pow(o.beta1, static_cast<double>(t));
        s.c2 = 1.0 - std::pow(o.beta2, static_cast<double>(t));
        for (size_t i = 0; i < wp.size(); ++i)
            ops::adamw(wp[i].dest->view(), wg[i].dest->view(), wm[i].view(), wv[i].view(), s);
    }
    const std::vector<float> p0 = values(want.lm.tensors(0));
    BOOST_TEST(!same_bits(p0, [&] {  // the updates moved the factors
        Setup fresh;
        make(fresh, preset, 0.0f);
        return values(fresh.lm.tensors(0));
    }()));
    BOOST_TEST(same_bits(values(got.lm.tensors(0)), p0));
    TensorList moments;  // m, v of each parameter, as state() lists them
    for (size_t i = 0; i < wp.size(); ++i) {
        moments.push_back(wp[i]), moments.back().dest = &wm[i];
        moments.push_back(wp[i]), moments.back().dest = &wv[i];
    }
    opt.download_state();  // nothing on the CPU: the update wrote the host moments
    BOOST_TEST(same_bits(values(opt.state()), values(moments)));
}

BOOST_DATA_TEST_CASE(resumed_from_its_state_it_continues_bit_for_bit,
                     data::make(kPresets),
                     preset) {
    Setup whole, first, resumed;
    make(whole, preset, 0.0f);
    make(first, preset, 0.0f);
    make(resumed, preset, 0.0f);
    const backend::Ctx ctx = backend::cpu_ctx();
    runtime::AdamW a = optimizer_of(whole, ctx), b = optimizer_of(first, ctx);
    for (int t = 1; t <= kSteps; ++t) {
        fill_grads(whole.lm, t);
        a.step(lr_of(t), clip_of(t), t);
    }
    for (int t = 1; t <= 2; ++t) {
        fill_grads(first.lm, t);
        b.step(lr_of(t), clip_of(t), t);
    }
    // the checkpoint: factors and moments copied as a save then a load would
    runtime::AdamW c = optimizer_of(resumed, ctx);
    b.download_state();
    auto copy = [](const TensorList& from, const TensorList& to) {
        for (size_t i = 0; i < from.size(); ++i)
            std::memcpy(
                to[i].dest->view().data, from[i].dest->view().data, from[i].dest->view().bytes());
    };
    copy(first.lm.tensors(0), resumed.lm.tensors(0));
    copy(b.state(), c.state());
    c.upload_state();
    for (int t = 3; t <= kSteps; ++t) {
        fill_grads(resumed.lm, t);
        c.step(lr_of(t), clip_of(t), t);
    }
    BOOST_TEST(same_bits(values(resumed.lm.tensors(0)), values(whole.lm.tensors(0))));
    BOOST_TEST(same_bits(values(c.state()), values(a.state())));
}

BOOST_AUTO_TEST_CASE(trainable_tensors_are_the_host_slots_in_order) {
    Setup s;
    make(s, "tiny-kimi", 0.0f);
    const TrainableLora t = host_trainable(s.lm);
    const TensorList p = s.lm.tensors(0), g = s.lm.tensors(0, true);
    BOOST_REQUIRE_EQUAL(t.factors.size(), p.size());
    BOOST_REQUIRE_EQUAL(t.grads.size(), g.size());
    for (size_t i = 0; i < p.size(); ++i) {
        BOOST_TEST(t.factors[i].data == p[i].dest->view().data);
        BOOST_TEST(t.grads[i].data == g[i].dest->view().data);
        BOOST_TEST((t.factors[i].shape == p[i].shape));
    }
}

// A CPU-Ctx LoraFactors holds copies: an update of them reaches the host slots only through
// download_factors, which brings every factor down in lm.tensors(0) order.
BOOST_AUTO_TEST_CASE(download_factors_brings_the_device_copies_to_the_host_slots) {
    Setup s;
    make(s, "tiny", 0.0f);
    const backend::Ctx ctx = backend::cpu_ctx();
    LoraFactors f(ctx, s.m, s.lm);
    const TrainableLora dev = f.trainable();
    const std::vector<float> before = values(s.lm.tensors(0));
    std::vector<float> want;
    for (size_t i = 0; i < dev.factors.size(); ++i) {
        float* x = dev.factors[i].ptr<float>();
        for (int64_t k = 0; k < dev.factors[i].numel(); ++k)
            x[k] = static_cast<float>(i) + 1e-3f * static_cast<float>(k);
        want.insert(want.end(), x, x + dev.factors[i].numel());
    }
    BOOST_TEST(same_bits(values(s.lm.tensors(0)), before));  // the host slots untouched
    f.download_factors();
    BOOST_TEST(same_bits(values(s.lm.tensors(0)), want));
}

BOOST_AUTO_TEST_SUITE_END()
