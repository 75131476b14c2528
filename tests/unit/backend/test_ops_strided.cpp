// The strided-matrix ops on a CPU context (backend/ops_strided.h): gemm over sub-blocks of larger
// tensors (offsets, row strides, transposes, beta 1) against a double-precision sum, and a matrix
// reaching past its tensor refused; copy_block moves exactly its block and leaves the rest;
// causal_softmax equals the causal mask added then ops::softmax_rows bit for bit, with and without
// a top-k mask, hidden keys at 0. The CUDA forms against these:
// tests/cuda/test_attention_backward.cpp.
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "hymoe/backend/ops.h"
#include "hymoe/backend/ops_strided.h"
#include "hymoe/core/error.h"
#include "hymoe/core/rng.h"

using namespace hymoe;

namespace {

Buffer random(Shape shape, uint32_t stream) {
    Buffer b(DType::f32, std::move(shape));
    Philox rng(23, stream, 0);
    rng.fill_normal(b.ptr<float>(), static_cast<size_t>(b.view().numel()), 0.0f, 1.0f);
    return b;
}

constexpr float inf = std::numeric_limits<float>::infinity();

}  // namespace

BOOST_AUTO_TEST_SUITE(ops_strided)

// C [5, 6] at column 3 of a [7, 12] tensor += 0.5 · op(A) op(B), A and B column blocks of wider
// tensors, for every combination of transposes.
BOOST_AUTO_TEST_CASE(gemm_on_blocks_matches_a_double_sum) {
    const backend::Ctx cpu = backend::cpu_ctx();
    const int64_t m = 5, n = 6, k = 4;
    for (bool ta : {false, true})
        for (bool tb : {false, true}) {
            const Buffer a = random({9, 10}, 1), b = random({9, 10}, 2);
            Buffer c = random({7, 12}, 3);
            const Buffer c0 = random({7, 12}, 3);
            const ops::MatRef ra{a.view(), 10 + 2, 10}, rb{b.view(), 3, 10},
                rc{c.view(), 12 + 3, 12};
            ops::gemm(cpu, ta, tb, m, n, k, 0.5f, ra, rb, 1.0f, rc);
            auto A = [&](int64_t i, int64_t l) {  // op(A)[i, l]
                return static_cast<double>(
                    a.ptr<float>()[ra.offset + (ta ? l * 10 + i : i * 10 + l)]);
            };
            auto B = [&](int64_t l, int64_t j) {
                return static_cast<double>(
                    b.ptr<float>()[rb.offset + (tb ? j * 10 + l : l * 10 + j)]);
            };
            double err = 0;
            for (int64_t r = 0; r < 7; ++r)
                for (int64_t col = 0; col < 12; ++col) {
                    const int64_t i = r - 1, j = col - 3;
                    double want = c0.ptr<float>()[r * 12 + col];
                    if (i >= 0 && i < m && j >= 0 && j < n)
                        for (int64_t l = 0; l < k; ++l)
                            want += 0.5 * A(i, l) * B(l, j);
                    err = std::max(
                        err, std::abs(want - static_cast<double>(c.ptr<float>()[r * 12 + col])));
                }
            BOOST_TEST_CONTEXT("trans_a " << ta << " trans_b " << tb) {
                BOOST_TEST(err < 1e-5);
            }
        }
    Buffer a = random({4, 4}, 4), c(DType::f32, {4, 4});
    BOOST_CHECK_THROW(ops::gemm(cpu,
                                false,
                                false,
                                4,
                                4,
                                4,
                                1.0f,
                                {a.view(), 1, 4},
                                {a.view(), 0, 4},
                                0.0f,
                                {c.view(), 0, 4}),
                      Error);
    BOOST_CHECK_THROW(ops::gemm(cpu,
                                false,
                                false,
                                2,
                                4,
                                4,
                                1.0f,
                                {a.view(), 0, 3},
                                {a.view(), 0, 4},
                                0.0f,
                                {c.view(), 0, 4}),
                      Error);
}

BOOST_AUTO_TEST_CASE(copy_block_moves_its_block_only) {
    const backend::Ctx cpu = backend::cpu_ctx();
    const Buffer src = random({6, 8}, 5);
    Buffer dst = random({5, 9}, 6);
    const Buffer dst0 = random({5, 9}, 6);
    ops::copy_block(cpu, 4, 3, {src.view(), 8 + 2, 8}, {dst.view(), 9 + 5, 9});
    for (int64_t r = 0; r < 5; ++r)
        for (int64_t col = 0; col < 9; ++col) {
            const bool in = r >= 1 && r < 5 && col >= 5 && col < 8;
            const float want =
                in ? src.ptr<float>()[r * 8 + col - 3] : dst0.ptr<float>()[r * 9 + col];
            BOOST_TEST(dst.ptr<float>()[r * 9 + col] == want);
        }
    BOOST_CHECK_THROW(ops::copy_block(cpu, 5, 3, {src.view(), 0, 8}, {dst.view(), 7, 9}), Error);
}

// Queries at positions 3..6 over 7 keys: causal_softmax against the causal mask (and a top-k
// mask) added by ops::add_inplace then ops::softmax_rows, bit for bit.
BOOST_AUTO_TEST_CASE(causal_softmax_equals_mask_then_softmax) {
    const backend::Ctx cpu = backend::cpu_ctx();
    const int64_t n_q = 4, n_k = 7, pos_first = 3;
    Buffer topk(DType::f32, {n_q, n_k});
    for (int64_t i = 0; i < n_q; ++i)
        for (int64_t u = 0; u < n_k; ++u)
            topk.ptr<float>()[i * n_k + u] = (u + i) % 3 == 0 && u <= pos_first + i ? 0.0f : -inf;
    for (bool with_mask : {false, true}) {
        Buffer x = random({n_q, n_k}, 7), want = random({n_q, n_k}, 7),
               mask(DType::f32, {n_q, n_k});
        for (int64_t i = 0; i < n_q; ++i)
            for (int64_t u = 0; u < n_k; ++u)
                mask.ptr<float>()[i * n_k + u] = with_mask ? topk.ptr<float>()[i * n_k + u]
                                                 : u <= pos_first + i ? 0.0f
                                                                      : -inf;
        ops::add_inplace(want.view(), mask.view());
        ops::softmax_rows(want.ptr<float>(), n_q, n_k);
        ops::causal_softmax(cpu, x.view(), pos_first, with_mask ? &topk.view() : nullptr);
        for (int64_t e = 0; e < n_q * n_k; ++e) {
            BOOST_TEST(x.ptr<float>()[e] == want.ptr<float>()[e]);
            if (mask.ptr<float>()[e] == -inf)
                BOOST_TEST(x.ptr<float>()[e] == 0.0f);
        }
    }
}

BOOST_AUTO_TEST_SUITE_END()
