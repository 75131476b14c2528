// Unit tests of the GPU ep MoE's host plan (hymoe/model/moe_ep_plan.h): the micro-batch split, the
// local expert index under blocks and a placement, one send plan worked by hand, received ids as
// local ones, and the whole dispatch → grouped experts (backend/moe_groups.h on the local ids) →
// slot-ordered combine simulated on the host over ep = 2..4 ranks
// with random routings (drops, empty ranks, overlap on and off), each token's result against the
// one-rank sum of its kept slots (values chosen so every fp32 sum is exact).
#include <cstdint>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "hymoe/backend/moe_groups.h"
#include "hymoe/core/error.h"
#include "hymoe/core/rng.h"
#include "hymoe/model/moe_ep_plan.h"

namespace {

using namespace hymoe;
using namespace hymoe::model;

// n_tok tokens' top-k of E experts, distinct per token, ~1 in 5 dropped, weights in quarters.
Routing random_routing(Philox& rng, int64_t n_tok, int64_t k, int64_t n_exp) {
    Routing r;
    for (int64_t t = 0; t < n_tok; ++t) {
        std::vector<int64_t> chosen;
        while (static_cast<int64_t>(chosen.size()) < k) {
            const auto e = static_cast<int64_t>(rng.next_u32() % static_cast<uint32_t>(n_exp));
            bool seen = false;
            for (int64_t c : chosen)
                seen = seen || c == e;
            if (!seen)
                chosen.push_back(e);
        }
        for (int64_t e : chosen) {
            const bool kept = rng.next_u32() % 5 != 0;
            r.idx.push_back(e);
            r.kept.push_back(kept ? 1 : 0);
            r.weight.push_back(kept ? 0.25f * static_cast<float>(1 + rng.next_u32() % 4) : 0.0f);
        }
    }
    return r;
}

// The one-rank result of token t: Σ over kept slots of weight · expert(x) with expert e's output
// x · (e + 1).
float one_rank(const Routing& r, int64_t k, int64_t t, float x) {
    float y = 0;
    for (int64_t i = 0; i < k; ++i) {
        const auto a = static_cast<size_t>(t * k + i);
        if (r.kept[a])
            y += r.weight[a] * x * static_cast<float>(r.idx[a] + 1);
    }
    return y;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(moe_ep_plan)

BOOST_AUTO_TEST_CASE(micro_batches_and_local_index) {
    const std::vector<RowRange> one = moe_micro_batches(7, false);
    BOOST_TEST(one.size() == 1u);
    BOOST_TEST((one[0].begin == 0 && one[0].count == 7));
    const std::vector<RowRange> two = moe_micro_batches(7, true);
    BOOST_TEST(two.size() == 2u);
    BOOST_TEST((two[0].begin == 0 && two[0].count == 4 && two[1].begin == 4 && two[1].count == 3));
    const std::vector<RowRange> none = moe_micro_batches(0, true);
    BOOST_TEST((none.size() == 2u && none[0].count == 0 && none[1].count == 0));

    BOOST_TEST(local_expert_index({}, 8, 2, 1) == (std::vector<int>{-1, -1, -1, -1, 0, 1, 2, 3}),
               boost::test_tools::per_element());
    const std::vector<int> placement{1, 0, 0, 1, 1, 0};
    BOOST_TEST(local_expert_index(placement, 6, 2, 1) == (std::vector<int>{0, -1, -1, 1, 2, -1}),
               boost::test_tools::per_element());
}

// 3 tokens, k = 2, E = 4 over ep = 2 (rank 0: e0 e1, rank 1: e2 e3). Token 0 → e3, e0; token 1 →
// e1, e0 (e0 dropped); token 2 → e2, e3. Rows: to rank 0 tokens 0 and 1, to rank 1 tokens 0 and 2.
BOOST_AUTO_TEST_CASE(send_plan_by_hand) {
    Routing r;
    r.idx = {3, 0, 1, 0, 2, 3};
    r.kept = {1, 1, 1, 0, 1, 1};
    r.weight = {0.5f, 0.25f, 1.0f, 0.0f, 0.75f, 0.125f};
    const EpSendPlan p = plan_ep_send(r, 2, {}, 4, 2, {0, 3});
    BOOST_TEST(p.send_rows == (std::vector<int64_t>{2, 2}), boost::test_tools::per_element());
    BOOST_TEST(p.token == (std::vector<int64_t>{0, 1, 0, 2}), boost::test_tools::per_element());
    BOOST_TEST(p.ids == (std::vector<int32_t>{-1, 0, 1, -1, 3, -1, 2, 3}),
               boost::test_tools::per_element());
    BOOST_TEST(p.weight == (std::vector<float>{0, 0.25f, 1.0f, 0, 0.5f, 0, 0.75f, 0.125f}),
               boost::test_tools::per_element());
    BOOST_TEST(p.back_row == (std::vector<int64_t>{0, 2, 1, -1, -1, 3}),
               boost::test_tools::per_element());

    const EpSendPlan tail = plan_ep_send(r, 2, {}, 4, 2, {1, 2});  // a micro-batch's rows
    BOOST_TEST(tail.token == (std::vector<int64_t>{1, 2}), boost::test_tools::per_element());
    BOOST_TEST(tail.back_row == (std::vector<int64_t>{0, -1, -1, 1}),
               boost::test_tools::per_element());

    const std::vector<int> on_rank1 = local_expert_index({}, 4, 2, 1);  // experts 2, 3
    BOOST_TEST(local_expert_ids({-1, 3, 2, -1}, on_rank1) == (std::vector<int32_t>{-1, 1, 0, -1}),
               boost::test_tools::per_element());
    BOOST_CHECK_THROW(local_expert_ids({0, -1}, on_rank1), Error);
}

// Every rank's tokens through the simulated pipeline equal the one-rank sums.
BOOST_AUTO_TEST_CASE(simulated_pipeline_matches_one_rank) {
    Philox rng(1234, 0, 0);
    const int64_t k = 3;
    for (int ep : {2, 3, 4})
        for (bool overlap : {false, true})
            for (bool placed : {false, true}) {
                const int64_t n_exp = 4 * ep;
                std::vector<int> placement;
                if (placed)
                    for (int64_t e = 0; e < n_exp; ++e)  // a permutation of the blocks
                        placement.push_back(static_cast<int>((e * 5 + 1) % n_exp / 4));
                std::vector<Routing> routing;
                std::vector<std::vector<float>> x, y;  // [ep][n_tok] payload, result
                for (int r = 0; r < ep; ++r) {
                    const int64_t n_tok = r == 1 ? 0 : 1 + rng.next_u32() % 9;  // rank 1 idle
                    routing.push_back(random_routing(rng, n_tok, k, n_exp));
                    x.emplace_back();
                    for (int64_t t = 0; t < n_tok; ++t)
                        x.back().push_back(static_cast<float>(1 + rng.next_u32() % 7));
                    y.emplace_back(static_cast<size_t>(n_tok), -1.0f);
                }
                const size_t n_batches = moe_micro_batches(0, overlap).size();
                for (size_t mb = 0; mb < n_batches; ++mb) {
                    std::vector<EpSendPlan> send;
                    for (int r = 0; r < ep; ++r)
                        send.push_back(
                            plan_ep_send(routing[static_cast<size_t>(r)],
                                         k,
                                         placement,
                                         n_exp,
                                         ep,
                                         moe_micro_batches(
                                             static_cast<int64_t>(x[static_cast<size_t>(r)].size()),
                                             overlap)[mb]));
                    // partial[src][dest]: the rows dest returns to src, in src's send order
                    std::vector<std::vector<std::vector<float>>> back(
                        static_cast<size_t>(ep), std::vector<std::vector<float>>(ep));
                    for (int dest = 0; dest < ep; ++dest) {
                        std::vector<int32_t> ids;
                        std::vector<float> weight, payload;
                        std::vector<int64_t> from;  // [n_recv] source rank
                        for (int src = 0; src < ep; ++src) {
                            const EpSendPlan& p = send[static_cast<size_t>(src)];
                            int64_t first = 0;
                            for (int d = 0; d < dest; ++d)
                                first += p.send_rows[static_cast<size_t>(d)];
                            for (int64_t row = first; row < first + p.send_rows[dest]; ++row) {
                                for (int64_t i = 0; i < k; ++i) {
                                    ids.push_back(p.ids[static_cast<size_t>(row * k + i)]);
                                    weight.push_back(p.weight[static_cast<size_t>(row * k + i)]);
                                }
                                payload.push_back(x[static_cast<size_t>(src)][static_cast<size_t>(
                                    p.token[static_cast<size_t>(row)])]);
                                from.push_back(src);
                            }
                        }
                        const std::vector<int> local =
                            local_expert_index(placement, n_exp, ep, dest);
                        std::vector<int64_t> expert_of_local;
                        for (int64_t e = 0; e < n_exp; ++e)
                            if (local[static_cast<size_t>(e)] >= 0)
                                expert_of_local.push_back(e);
                        const std::vector<int32_t> local_ids = local_expert_ids(ids, local);
                        const backend::MoeGroups plan =
                            backend::moe_group_rows(local_ids.data(),
                                                    static_cast<int64_t>(payload.size()),
                                                    k,
                                                    static_cast<int64_t>(expert_of_local.size()));
                        // grouped rows: expert of each, from the permute map
                        std::vector<float> grouped(static_cast<size_t>(plan.n_rows()));
                        const std::vector<int64_t>& group_start = plan.offset;
                        for (size_t a = 0; a < plan.row.size(); ++a)
                            if (plan.row[a] >= 0) {
                                size_t le = 0;
                                while (group_start[le + 1] <= plan.row[a])
                                    ++le;
                                BOOST_TEST(expert_of_local[le] == ids[a]);
                                grouped[static_cast<size_t>(plan.row[a])] =
                                    payload[a / static_cast<size_t>(k)] *
                                    static_cast<float>(ids[a] + 1);
                            }
                        for (size_t row = 0; row < payload.size(); ++row) {
                            float partial = 0;
                            for (int64_t i = 0; i < k; ++i) {
                                const size_t a = row * static_cast<size_t>(k) + i;
                                if (plan.row[a] >= 0)
                                    partial +=
                                        weight[a] * grouped[static_cast<size_t>(plan.row[a])];
                            }
                            back[static_cast<size_t>(from[row])][static_cast<size_t>(dest)]
                                .push_back(partial);
                        }
                    }
                    for (int src = 0; src < ep; ++src) {
                        const EpSendPlan& p = send[static_cast<size_t>(src)];
                        std::vector<float> returned;  // [n_send] in send order
                        for (int d = 0; d < ep; ++d)
                            for (float v : back[static_cast<size_t>(src)][static_cast<size_t>(d)])
                                returned.push_back(v);
                        BOOST_TEST(static_cast<int64_t>(returned.size()) == p.n_send());
                        for (int64_t t = 0; t < p.tokens.count; ++t) {
                            float acc = 0;
                            for (int d = 0; d < ep; ++d) {
                                const int64_t row = p.back_row[static_cast<size_t>(t * ep + d)];
                                if (row >= 0)
                                    acc += returned[static_cast<size_t>(row)];
                            }
                            y[static_cast<size_t>(src)][static_cast<size_t>(p.tokens.begin + t)] =
                                acc;
                        }
                    }
                }
                for (int r = 0; r < ep; ++r)
                    for (size_t t = 0; t < x[static_cast<size_t>(r)].size(); ++t)
                        BOOST_TEST(y[static_cast<size_t>(r)][t] ==
                                   one_rank(routing[static_cast<size_t>(r)],
                                            k,
                                            static_cast<int64_t>(t),
                                            x[static_cast<size_t>(r)][t]));
            }
}

BOOST_AUTO_TEST_SUITE_END()
