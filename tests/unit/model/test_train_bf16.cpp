// The training pass with the frozen matrices in bf16 (model.dtype bf16) against its fp32 twin
// (the same matrices rounded to bf16, held in fp32) on the three tiny presets with adapters on
// every target: the CPU's form of the GPU trainer's bf16 parity (tests/cuda/test_train.cpp), under
// the bounds train_setup.h derives. The AVX-512-BF16 kernels round each product's fp32 input to
// bf16 as the GPU does (within the bounds); the portable kernels widen the matrix and keep the
// input, so the twin's pass is reproduced to fp32 summation order (bit for bit on this host).
#include <cmath>
#include <string>
#include <vector>

#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include "hymoe/backend/ops.h"
#include "hymoe/model/train.h"
#include "train_setup.h"

namespace data = boost::unit_test::data;
using namespace hymoe;
using namespace hymoe::model;
using namespace hymoe::train_test;

BOOST_AUTO_TEST_SUITE(train_bf16)

BOOST_DATA_TEST_CASE(bf16_pass_follows_the_fp32_twin, data::make(kPresets), preset) {
    for (ops::WeightKernel k : {ops::WeightKernel::avx512_bf16, ops::WeightKernel::portable}) {
        ops::set_weight_kernel(ops::WeightKernel::automatic);
        if (k == ops::WeightKernel::avx512_bf16 && ops::weight_kernel() != k)
            continue;  // this CPU has no avx512_bf16
        ops::set_weight_kernel(k);
        BOOST_TEST_CONTEXT(ops::to_string(k)) {
            Setup m16, m32;
            make(m16, preset, 0.1f, DType::bf16);
            make(m32, preset, 0.1f);
            round_matrices(m32.m);
            const TrainBatch b = two_docs(m16.m.cfg.vocab_size);
            std::vector<std::vector<int64_t>> load16 = no_load(m16.m), load32 = no_load(m32.m);
            TrainOptions o16, o32;
            o16.expert_load = &load16, o32.expert_load = &load32;
            zero(m16.lm);
            zero(m32.lm);
            const LossSums got = train_forward_backward(m16.m, b, o16);
            const LossSums want = train_forward_backward(m32.m, b, o32);
            const std::vector<float> g = grads(m16.lm), w = grads(m32.lm);
            BOOST_REQUIRE_EQUAL(g.size(), w.size());
            const double loss_diff = std::abs(got.loss - want.loss) / want.loss;
            const double grad_diff = max_abs_rel(g, w);
            BOOST_TEST_MESSAGE(preset << ", " << ops::to_string(k) << ": loss " << loss_diff
                                      << ", gradients " << grad_diff
                                      << (load16 == load32 ? "" : " (experts switched)"));
            if (k == ops::WeightKernel::portable) {  // the twin's products, blocked differently
                BOOST_TEST(loss_diff <= 1e-6);
                BOOST_TEST(grad_diff <= 1e-5);
            } else {
                BOOST_TEST(loss_diff <= kBf16Loss);
                BOOST_TEST(grad_diff <= bf16_grad_bound(preset, load16 == load32));
            }
        }
    }
    ops::set_weight_kernel(ops::WeightKernel::automatic);
}

BOOST_AUTO_TEST_SUITE_END()
