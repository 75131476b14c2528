// The model's two ends on a CPU context (backend/ops_head.h) against the same written out:
// embed_rows copies a token's row widened from an f32, bf16 or f16 table, offset by the rank's
// first row, and zeroes the rows of tokens another rank holds; top_logits keeps each row's best
// tokens in the sampler's order (ties to the smaller id) with their logits and the row's
// log Σ e^{x − max} in double (runtime/sampler.h's token_logprob). The CUDA forms against these
// are tests/cuda/test_ops_head.cpp.
#include <cmath>
#include <cstdint>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "hymoe/backend/ops_head.h"
#include "hymoe/core/error.h"
#include "hymoe/core/rng.h"
#include "hymoe/core/types.h"
#include "hymoe/runtime/sampler.h"

using namespace hymoe;

namespace {

Tensor host(std::vector<int64_t>& v) {
    return Tensor{v.data(), DType::i64, Device::cpu, {static_cast<int64_t>(v.size())}};
}

}  // namespace

BOOST_AUTO_TEST_SUITE(ops_head)

BOOST_AUTO_TEST_CASE(embed_rows_widen_and_offset) {
    const backend::Ctx cpu = backend::cpu_ctx();
    const int64_t rows = 4, d = 6, lo = 8;  // this rank holds ids 8..11
    Buffer table(DType::f32, {rows, d});
    Philox rng(5, 1, 0);
    rng.fill_normal(table.ptr<float>(), static_cast<size_t>(rows * d), 0.0f, 1.0f);
    std::vector<int64_t> ids = {9, 3, 11, 8, 12};  // 3 and 12: another rank's rows
    for (DType t : {DType::f32, DType::bf16, DType::f16}) {
        Buffer stored(t, {rows, d});
        for (int64_t i = 0; i < rows * d; ++i) {
            const float x = table.ptr<float>()[i];
            if (t == DType::f32)
                stored.ptr<float>()[i] = x;
            else
                stored.ptr<uint16_t>()[i] = t == DType::bf16 ? float_to_bf16(x) : float_to_f16(x);
        }
        Buffer h(DType::f32, {5, d});
        h.ptr<float>()[d] = 7.0f;  // overwritten with zeros
        Tensor tokens = host(ids);
        ops::embed_rows(cpu, stored.view(), tokens, lo, h.view());
        for (size_t t_i = 0; t_i < ids.size(); ++t_i)
            for (int64_t j = 0; j < d; ++j) {
                const int64_t r = ids[t_i] - lo;
                float want = 0.0f;
                if (r >= 0 && r < rows) {
                    const int64_t at = r * d + j;
                    want = t == DType::f32    ? stored.ptr<float>()[at]
                           : t == DType::bf16 ? bf16_to_float(stored.ptr<uint16_t>()[at])
                                              : f16_to_float(stored.ptr<uint16_t>()[at]);
                }
                BOOST_TEST(h.ptr<float>()[static_cast<int64_t>(t_i) * d + j] == want);
            }
    }
}

BOOST_AUTO_TEST_CASE(top_logits_sampler_order_and_log_sum) {
    const backend::Ctx cpu = backend::cpu_ctx();
    const int64_t r = 3, V = 50, n = 4;
    Buffer logits(DType::f32, {r, V});
    Philox rng(6, 2, 0);
    rng.fill_normal(logits.ptr<float>(), static_cast<size_t>(r * V), 0.0f, 2.0f);
    float* x = logits.ptr<float>();
    x[V + 7] = x[V + 30] = 9.0f;  // row 1: a tie at the top goes to the smaller id
    Buffer idx(DType::i64, {r, n}), values(DType::f32, {r, n}), log_sum(DType::i64, {r});
    ops::top_logits(cpu, logits.view(), idx.view(), values.view(), log_sum.view());
    BOOST_TEST(idx.ptr<int64_t>()[n] == 7);
    BOOST_TEST(idx.ptr<int64_t>()[n + 1] == 30);
    for (int64_t i = 0; i < r; ++i) {
        const float* row = x + i * V;
        std::vector<int64_t> want(static_cast<size_t>(n));
        std::vector<float> logprobs(static_cast<size_t>(n));
        runtime::top_logprobs(row, V, static_cast<int>(n), want.data(), logprobs.data());
        const double sum = static_cast<const double*>(log_sum.view().data)[i];
        for (int64_t j = 0; j < n; ++j) {
            const int64_t tok = idx.ptr<int64_t>()[i * n + j];
            BOOST_TEST(tok == want[static_cast<size_t>(j)]);
            BOOST_TEST(values.ptr<float>()[i * n + j] == row[tok]);
            // the sampler's logprob from the reduced row: x − max − log_sum
            const double lp = static_cast<double>(row[tok]) -
                              static_cast<double>(row[idx.ptr<int64_t>()[i * n]]) - sum;
            BOOST_TEST(static_cast<float>(lp) == logprobs[static_cast<size_t>(j)]);
            BOOST_TEST(runtime::token_logprob(row, V, tok) == lp);
        }
    }
}

BOOST_AUTO_TEST_CASE(top_logits_refuses_bad_shapes) {
    const backend::Ctx cpu = backend::cpu_ctx();
    Buffer logits(DType::f32, {2, 5}), idx(DType::i64, {2, 6}), values(DType::f32, {2, 6});
    Buffer log_sum(DType::i64, {2});
    BOOST_CHECK_THROW(
        ops::top_logits(cpu, logits.view(), idx.view(), values.view(), log_sum.view()), Error);
}

BOOST_AUTO_TEST_SUITE_END()
