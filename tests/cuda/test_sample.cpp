// Greedy decoding and logprobs on the GPU against the host sampler (runtime/sampler.h): the
// argmax with tied maxima (smallest id wins, compared exactly) and log_softmax of the chosen and
// of given tokens, over vocabulary-sized rows with −inf entries; a row's top tokens reduced for the
// host sampler (top_k_rows + top_logit_rows, model::TopLogits) against the host's top logprobs.
#include <cmath>
#include <cstdint>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "cuda_test.h"
#include "hymoe/backend/cuda_ops.h"
#include "hymoe/runtime/sampler.h"

namespace utf = boost::unit_test;
using namespace hymoe;
using namespace hymoe::cuda_test;

BOOST_AUTO_TEST_SUITE(cuda_sample, *utf::label("cuda"))

BOOST_AUTO_TEST_CASE(greedy_and_token_logprobs_match_the_host_sampler,
                     *utf::precondition(need_gpu)) {
    Gpu g;
    for (int64_t V : {int64_t{7}, int64_t{163840}}) {
        const int64_t rows = 5;
        Buffer logits = random({rows, V}, 80, DType::f32, 4.0f);
        float* l = logits.ptr<float>();
        l[0 * V + V - 1] = 30.0f;  // row 0: two equal maxima, the smaller id must win
        l[0 * V + 2] = 30.0f;
        l[1 * V + 0] = -INFINITY;  // row 1: a masked entry
        for (int64_t i = 0; i < V; ++i)
            l[3 * V + i] = 1.0f;  // row 3: all equal
        std::vector<int64_t> given(static_cast<size_t>(rows));
        for (int64_t r = 0; r < rows; ++r)
            given[static_cast<size_t>(r)] = (r * 7919 + 3) % V;
        Tensor dl = to_device(logits.view(), DType::f32, g.arena, g.s);
        Tensor dtok = g.arena.tensor(DType::i64, {rows});
        Tensor dlp = g.arena.tensor(DType::f32, {rows});
        Tensor dgiven = to_device_i64(given, g.arena, g.s);
        Tensor dglp = g.arena.tensor(DType::f32, {rows});
        cu::greedy_rows(g.s, dl, dtok, dlp);
        cu::token_logprobs(g.s, dl, dgiven, dglp);
        std::vector<int64_t> tok(static_cast<size_t>(rows));
        std::vector<float> lp(static_cast<size_t>(rows)), glp(static_cast<size_t>(rows));
        cu::copy_to_host(tok.data(), dtok.data, tok.size() * sizeof(int64_t), g.s);
        cu::copy_to_host(lp.data(), dlp.data, lp.size() * sizeof(float), g.s);
        cu::copy_to_host(glp.data(), dglp.data, glp.size() * sizeof(float), g.s);
        g.s.synchronize();
        for (int64_t r = 0; r < rows; ++r) {
            const size_t i = static_cast<size_t>(r);
            const int64_t want = runtime::argmax_token(l + r * V, V);
            BOOST_TEST_INFO("V " << V << " row " << r);
            BOOST_TEST(tok[i] == want);
            const double want_lp = runtime::token_logprob(l + r * V, V, want);
            BOOST_TEST(std::abs(static_cast<double>(lp[i]) - want_lp) <=
                       1e-5 * (1.0 + std::abs(want_lp)));
            const double want_glp = runtime::token_logprob(l + r * V, V, given[i]);
            BOOST_TEST(std::abs(static_cast<double>(glp[i]) - want_glp) <=
                       1e-5 * (1.0 + std::abs(want_glp)));
        }
        BOOST_TEST(tok[0] == 2);
    }
}

BOOST_AUTO_TEST_CASE(top_rows_give_the_host_samplers_top_logprobs, *utf::precondition(need_gpu)) {
    Gpu g;
    const int64_t rows = 4, V = 163840;
    Buffer logits = random({rows, V}, 81, DType::f32, 4.0f);
    float* l = logits.ptr<float>();
    for (int64_t i = 0; i < 8; ++i)
        l[2 * V + 1000 * i + 5] = 25.0f;  // row 2: eight tied maxima, smaller ids first
    Tensor dl = to_device(logits.view(), DType::f32, g.arena, g.s);
    for (int64_t n : {int64_t{1}, int64_t{5}, int64_t{64}}) {
        Tensor idx = g.arena.tensor(DType::i64, {rows, n});
        Tensor values = g.arena.tensor(DType::f32, {rows, n});
        Tensor sums = g.arena.tensor(DType::i64, {rows});  // doubles
        cu::top_k_rows(g.s, dl, n, idx);
        cu::top_logit_rows(g.s, dl, idx, values, static_cast<double*>(sums.data));
        std::vector<int64_t> tok(static_cast<size_t>(rows * n));
        std::vector<float> val(tok.size());
        std::vector<double> log_sum(static_cast<size_t>(rows));
        cu::copy_to_host(tok.data(), idx.data, idx.bytes(), g.s);
        cu::copy_to_host(val.data(), values.data, values.bytes(), g.s);
        cu::copy_to_host(log_sum.data(), sums.data, sums.bytes(), g.s);
        g.s.synchronize();
        std::vector<int64_t> want_tok(static_cast<size_t>(n));
        std::vector<float> want_lp(static_cast<size_t>(n));
        for (int64_t r = 0; r < rows; ++r) {
            runtime::top_logprobs(
                l + r * V, V, static_cast<int>(n), want_tok.data(), want_lp.data());
            for (int64_t i = 0; i < n; ++i) {
                const size_t k = static_cast<size_t>(r * n + i);
                BOOST_TEST_INFO("n " << n << " row " << r << " rank " << i);
                BOOST_TEST(tok[k] == want_tok[static_cast<size_t>(i)]);
                BOOST_TEST(val[k] == l[r * V + want_tok[static_cast<size_t>(i)]]);
                const double lp = static_cast<double>(val[k]) -
                                  static_cast<double>(val[static_cast<size_t>(r * n)]) -
                                  log_sum[static_cast<size_t>(r)];
                BOOST_TEST(std::abs(lp - static_cast<double>(want_lp[static_cast<size_t>(i)])) <=
                           1e-6 * (1.0 + std::abs(lp)));
            }
        }
        for (Tensor* t : {&idx, &values, &sums})
            g.arena.free(t->data);
    }
}

BOOST_AUTO_TEST_SUITE_END()
