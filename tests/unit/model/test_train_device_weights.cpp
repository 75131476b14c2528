// The LoRA trainer's device side made on the CPU: the weights uploaded by the device model's walk
// of the weight list (model/device_weights.h make_device_weights: the routed experts stacked, the
// matrices at the model's dtype) with the adapter as device factors (model/lora_factors.h), the
// pass run on their views (model/train.h TrainOn). One pass's loss, counts and adapter gradients
// are the host pass's bit for bit, for the three tiny presets with adapters on every target and
// dropout 0.1, with fp32 matrices and with bf16 ones (the host model holding its matrices in bf16
// too); the gradients come down only through download_grads.
#include <memory>
#include <string>
#include <vector>

#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include "hymoe/model/device_weights.h"
#include "hymoe/model/lora_factors.h"
#include "hymoe/model/train.h"
#include "train_setup.h"

namespace data = boost::unit_test::data;
using namespace hymoe;
using namespace hymoe::model;
using namespace hymoe::train_test;

namespace {

const DType kMatrices[] = {DType::f32, DType::bf16};

}  // namespace

BOOST_AUTO_TEST_SUITE(train_device_weights)

BOOST_DATA_TEST_CASE(one_pass_equals_the_host_pass,
                     data::make(kPresets) * data::xrange(2),
                     preset,
                     k) {
    const DType matrices = kMatrices[k];
    Setup host, dev;
    make(host, preset, 0.1f, matrices);
    make(dev, preset, 0.1f, matrices);
    const TrainBatch b = two_docs(host.m.cfg.vocab_size);
    zero(host.lm);
    const LossSums want = train_forward_backward(host.m, b, {});

    const std::unique_ptr<DeviceWeights> weights =
        make_device_weights(dev.m, Device::cpu, matrices, size_t{64} << 20);
    LoraFactors factors(weights->ctx(), dev.m, dev.lm);
    const ModelViews views = factors.attach(weights->views());
    zero(dev.lm);
    const LossSums got = train_forward_backward(TrainOn{dev.m, weights->ctx(), views}, {&b, 1}, {});
    BOOST_TEST(grads(dev.lm) == std::vector<float>(grads(dev.lm).size(), 0.0f),
               boost::test_tools::per_element());  // not yet brought down
    factors.download_grads();
    BOOST_TEST(got.loss == want.loss);
    BOOST_TEST(got.targets == want.targets);
    BOOST_TEST(got.correct == want.correct);
    BOOST_TEST(grads(dev.lm) == grads(host.lm), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_SUITE_END()
