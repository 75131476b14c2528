// Unit tests of expert placement rebalancing (hymoe/model/eplb.h): the greedy placement and its
// imbalance on a case worked by hand, every rank's slot count on random loads, and moving experts
// on a rank of an ep = 2 model: given-up experts freed, arriving ones bit-identical to the same
// experts of a whole model with the same seed.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "hymoe/core/rng.h"
#include "hymoe/model/eplb.h"
#include "hymoe/model/shard.h"

namespace {

using namespace hymoe;
using namespace hymoe::model;

bool same(const Buffer& a, const Buffer& b) {
    return a.view().shape == b.view().shape &&
           std::memcmp(a.ptr<float>(), b.ptr<float>(), a.view().bytes()) == 0;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(eplb)

// loads 10 1 1 10 5 5 0 0 over 2 ranks of 4 slots. By load: e0 → r0, e3 → r1, e4 → r0 (tie: lower
// rank), e5 → r1, e1 → r0, e2 → r1, e6 → r0, e7 → r1: 16 each. The contiguous blocks give 22 and
// 10: max/mean = 22/16.
BOOST_AUTO_TEST_CASE(greedy_placement_by_hand) {
    const std::vector<int64_t> load{10, 1, 1, 10, 5, 5, 0, 0};
    const std::vector<int> p = balanced_placement(load, 2);
    BOOST_TEST(p == (std::vector<int>{0, 0, 1, 1, 0, 1, 0, 1}), boost::test_tools::per_element());
    BOOST_TEST(placement_imbalance(load, p, 2) == 1.0);
    BOOST_TEST(placement_imbalance(load, {}, 2) == 22.0 / 16.0);
    BOOST_TEST(placement_imbalance(std::vector<int64_t>(8, 0), {}, 2) == 1.0);
}

BOOST_AUTO_TEST_CASE(every_rank_gets_its_slots_and_never_worse_than_blocks) {
    Philox rng(3, 0, 0);
    for (int trial = 0; trial < 50; ++trial) {
        const int ep = 1 << (trial % 4), n_exp = 16;
        std::vector<int64_t> load(n_exp);
        for (int64_t& l : load)
            l = rng.next_u32() % 1000 * (rng.next_u32() % 4 == 0 ? 20 : 1);  // a few hot experts
        const std::vector<int> p = balanced_placement(load, ep);
        for (int r = 0; r < ep; ++r)
            BOOST_TEST(std::count(p.begin(), p.end(), r) == n_exp / ep);
        BOOST_TEST(placement_imbalance(load, p, ep) <= placement_imbalance(load, {}, ep) + 1e-12);
    }
}

BOOST_AUTO_TEST_CASE(moving_experts_frees_and_fills_them) {
    const ModelConfig cfg = preset_config("tiny");  // 8 experts, layers 1-3 MoE
    Model whole = make_model(cfg);
    init_model_random(whole, 5);
    Model m = make_model(cfg);
    m.shard.ep = 2;  // ep rank 0 of 2: experts 0-3
    init_model_random(m, 5);
    const int layer = 2;
    auto fill = [&](const TensorList& list) { init_tensors_random(list, m.shard, 5); };
    const int arrived = place_experts(m, layer, {0, 0, 1, 1, 0, 1, 0, 1}, fill);
    BOOST_TEST(arrived == 2);
    const MoeWeights& w = m.layers[layer].moe;
    for (int e : {2, 3, 5, 7})
        BOOST_TEST(w.experts[e].up_proj.view().data == nullptr);
    for (int e : {0, 1, 4, 6}) {
        BOOST_TEST(same(w.experts[e].up_proj, whole.layers[layer].moe.experts[e].up_proj));
        BOOST_TEST(same(w.experts[e].down_proj, whole.layers[layer].moe.experts[e].down_proj));
    }
    BOOST_TEST(hosted_experts(m.local, m.shard, w.expert_rank) == (std::vector<int>{0, 1, 4, 6}),
               boost::test_tools::per_element());
}

// Each expert's position among its rank's experts, ascending ids; −1 elsewhere.
BOOST_AUTO_TEST_CASE(local_index_of_hosted_experts) {
    BOOST_TEST(local_expert_index({}, 8, 2, 1) == (std::vector<int>{-1, -1, -1, -1, 0, 1, 2, 3}),
               boost::test_tools::per_element());
    const std::vector<int> placement{1, 0, 0, 1, 1, 0};
    BOOST_TEST(local_expert_index(placement, 6, 2, 1) == (std::vector<int>{0, -1, -1, 1, 2, -1}),
               boost::test_tools::per_element());
}

BOOST_AUTO_TEST_SUITE_END()
