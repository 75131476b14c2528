// The DSA indexer on the GPU against ops::indexer_scores (scores over every key, ReLU'd heads
// weighted and summed), the decode step's selection (top_k_rows of the one query's scores keeps
// what ops::indexer_mask keeps), and the prefill's causal masks against ops::indexer_mask on
// scores with ties, on both top-k paths (short rows; long rows by radix select).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "cuda_test.h"
#include "hymoe/backend/cuda_ops.h"
#include "hymoe/backend/ops_attention.h"
#include "hymoe/model/attention.h"

namespace utf = boost::unit_test;
using namespace hymoe;
using namespace hymoe::cuda_test;

BOOST_AUTO_TEST_SUITE(cuda_indexer, *utf::label("cuda"))

BOOST_AUTO_TEST_CASE(scores_and_decode_selection_match_the_cpu, *utf::precondition(need_gpu)) {
    Gpu g;
    const int64_t H = 8, d = 64;
    for (auto [n_q, n_k] : {std::array<int64_t, 2>{5, 300}, {1, 3000}}) {
        Buffer q = random({n_q, H * d}, 110, DType::f32);
        Buffer w = random({n_q, H}, 111, DType::f32, 0.1f);
        Buffer k = random({n_k, d}, 112, DType::f32);
        Buffer want(DType::f32, {n_q, n_k});
        ops::indexer_scores(q.view(), w.view(), k.view(), want.view());
        Tensor dq = to_device(q.view(), DType::f32, g.arena, g.s);
        Tensor dw = to_device(w.view(), DType::f32, g.arena, g.s);
        Tensor dk = to_device(k.view(), DType::f32, g.arena, g.s);
        Tensor ds = g.arena.tensor(DType::f32, {n_q, n_k});
        cu::indexer_scores(g.s, dq, dw, dk, ds);
        Buffer got = to_host(ds, g.s);
        const double err = rel_error(got.ptr<float>(), want.ptr<float>(), n_q * n_k);
        BOOST_TEST_INFO("n_q " << n_q << " n_k " << n_k << ": normalised error " << err);
        BOOST_TEST(err < tolerance(DType::f32));
        if (n_q == 1) {  // decode: the last query sees every key; select on the CPU's scores
            const int64_t top = 2048;
            Buffer mask(DType::f32, {1, n_k});
            ops::indexer_mask(want.view(), n_k - 1, top, mask.view());
            Tensor dwant = to_device(want.view(), DType::f32, g.arena, g.s);
            Tensor didx = g.arena.tensor(DType::i64, {1, top});
            cu::top_k_rows(g.s, dwant, top, didx);
            std::vector<int64_t> idx(static_cast<size_t>(top));
            cu::copy_to_host(idx.data(), didx.data, idx.size() * sizeof(int64_t), g.s);
            g.s.synchronize();
            std::vector<float> kept(static_cast<size_t>(n_k), -INFINITY);
            for (int64_t u : idx)
                kept[static_cast<size_t>(u)] = 0.0f;
            BOOST_TEST(std::vector<float>(mask.ptr<float>(), mask.ptr<float>() + n_k) == kept,
                       boost::test_tools::per_element());
        }
    }
}

BOOST_AUTO_TEST_CASE(causal_prefill_masks_match_the_cpu, *utf::precondition(need_gpu)) {
    Gpu g;
    for (auto [n_q, pos_first, top] : {std::array<int64_t, 3>{30, 10, 16}, {40, 2000, 512}}) {
        const int64_t n_k = pos_first + n_q;
        Buffer scores(DType::f32, {n_q, n_k});
        Philox rng(11, static_cast<uint32_t>(n_k), 0);
        for (int64_t i = 0; i < n_q * n_k; ++i)  // 50 levels: ties at every threshold
            scores.ptr<float>()[i] = std::floor(rng.uniform() * 50.0f);
        Buffer want(DType::f32, {n_q, n_k});
        ops::indexer_mask(scores.view(), pos_first, top, want.view());
        Tensor ds = to_device(scores.view(), DType::f32, g.arena, g.s);
        const int64_t k = std::min(top, n_k);
        Tensor didx = g.arena.tensor(DType::i64, {n_q, k});
        Tensor dmask = g.arena.tensor(DType::f32, {n_q, n_k});
        cu::indexer_mask(g.s, ds, pos_first, top, didx, dmask);
        Buffer got = to_host(dmask, g.s);
        BOOST_TEST_INFO("n_q " << n_q << " first position " << pos_first << " top " << top);
        BOOST_TEST(std::vector<float>(got.ptr<float>(), got.ptr<float>() + n_q * n_k) ==
                       std::vector<float>(want.ptr<float>(), want.ptr<float>() + n_q * n_k),
                   boost::test_tools::per_element());
    }
}

BOOST_AUTO_TEST_SUITE_END()
