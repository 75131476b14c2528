// The LoRA row ops of backend/ops_lora.h on the CPU: lora_rows_backward (and so
// lora_pair_backward) against a plain double-precision reference written here, for a trained
// adapter on scattered rows (dx's other rows untouched) and a frozen one (no dA: dx only), and
// the op on a CPU Ctx bit-identical to its CPU form. The same ops on a CUDA context against these
// are in tests/cuda/test_backward_ops.cpp.
#include <cmath>
#include <cstring>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "hymoe/backend/ops_lora.h"
#include "hymoe/core/rng.h"

using namespace hymoe;

namespace {

Buffer random(Shape shape, uint32_t stream) {
    Buffer b(DType::f32, std::move(shape));
    Philox(17, stream, 0).fill_normal(b.ptr<float>(), static_cast<size_t>(b.view().numel()), 0, 1);
    return b;
}

Buffer copy_of(const Buffer& b) {
    Buffer c(b.view().dtype, b.view().shape);
    std::memcpy(c.view().data, b.view().data, b.view().bytes());
    return c;
}

bool same_bits(const Buffer& a, const Buffer& b) {
    return a.view().bytes() == b.view().bytes() &&
           std::memcmp(a.view().data, b.view().data, a.view().bytes()) == 0;
}

// max |a − ref| / max(1, |ref|)
double rel_err(const Buffer& a, const std::vector<double>& ref) {
    double e = 0;
    for (size_t i = 0; i < ref.size(); ++i)
        e = std::max(e,
                     std::abs(static_cast<double>(a.ptr<float>()[i]) - ref[i]) /
                         std::max(1.0, std::abs(ref[i])));
    return e;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(lora_ops)

// On rows {4, 0, 2} of n = 6: g = dy B, dB += s dyᵀ (x Aᵀ), dA += s gᵀ x, dx rows += s g A.
BOOST_AUTO_TEST_CASE(rows_backward_matches_reference) {
    const int64_t n = 6, in = 10, out = 7, r = 3;
    const float s = 0.75f;
    std::vector<int64_t> idx = {4, 0, 2};
    const Tensor rows{idx.data(), DType::i64, Device::cpu, {3}};
    const Buffer A = random({r, in}, 1), B = random({out, r}, 2), x = random({n, in}, 3),
                 dy = random({n, out}, 4), dA0 = random({r, in}, 5), dB0 = random({out, r}, 6),
                 dx0 = random({n, in}, 7);
    for (bool train : {true, false}) {
        Buffer dA = copy_of(dA0), dB = copy_of(dB0), dx = copy_of(dx0);
        Tensor dAv = train ? dA.view() : Tensor{}, dBv = train ? dB.view() : Tensor{};
        Tensor dxv = dx.view();
        ops::lora_rows_backward(rows, A.view(), B.view(), s, x.view(), dy.view(), dAv, dBv, dxv);
        std::vector<double> rA(r * in), rB(out * r), rx(n * in);
        auto start = [](const Buffer& b, std::vector<double>& ref) {
            for (size_t i = 0; i < ref.size(); ++i)
                ref[i] = static_cast<double>(b.ptr<float>()[i]);
        };
        start(dA0, rA);
        start(dB0, rB);
        start(dx0, rx);
        const double sd = s;
        auto at = [](const Buffer& b, int64_t i) { return static_cast<double>(b.ptr<float>()[i]); };
        for (int64_t row : idx)
            for (int64_t k = 0; k < r; ++k) {
                double t = 0, g = 0;  // (x Aᵀ)[k], (dy B)[k]
                for (int64_t c = 0; c < in; ++c)
                    t += at(x, row * in + c) * at(A, k * in + c);
                for (int64_t o = 0; o < out; ++o)
                    g += at(dy, row * out + o) * at(B, o * r + k);
                for (int64_t o = 0; o < out; ++o)
                    rB[o * r + k] += sd * at(dy, row * out + o) * t;
                for (int64_t c = 0; c < in; ++c) {
                    rA[k * in + c] += sd * g * at(x, row * in + c);
                    rx[row * in + c] += sd * g * at(A, k * in + c);
                }
            }
        BOOST_TEST(rel_err(dx, rx) < 1e-5, (train ? "trained" : "frozen") << " dx");
        if (train) {
            BOOST_TEST(rel_err(dA, rA) < 1e-5);
            BOOST_TEST(rel_err(dB, rB) < 1e-5);
        } else {
            BOOST_TEST(same_bits(dA, dA0));  // untouched
            BOOST_TEST(same_bits(dB, dB0));
        }
        for (int64_t row : {1, 3, 5})  // rows outside the list untouched
            BOOST_TEST(std::memcmp(dx.ptr<float>() + row * in,
                                   dx0.ptr<float>() + row * in,
                                   in * sizeof(float)) == 0);

        Buffer cA = copy_of(dA0), cB = copy_of(dB0), cx = copy_of(dx0);
        Tensor cAv = train ? cA.view() : Tensor{}, cBv = train ? cB.view() : Tensor{};
        Tensor cxv = cx.view();
        ops::lora_rows_backward(
            backend::cpu_ctx(), rows, A.view(), B.view(), s, x.view(), dy.view(), cAv, cBv, cxv);
        BOOST_TEST(same_bits(cx, dx));
        BOOST_TEST(same_bits(cA, dA));
        BOOST_TEST(same_bits(cB, dB));
    }
}

BOOST_AUTO_TEST_SUITE_END()
