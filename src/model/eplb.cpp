// Expert placement rebalancing (model/eplb.h): the greedy placement, its imbalance, and moving a
// layer's experts.
#include "hymoe/model/eplb.h"

#include <algorithm>
#include <numeric>

#include "hymoe/core/error.h"

namespace hymoe::model {

namespace {

// The ranks' summed loads [ep] under placement.
std::vector<int64_t> rank_loads(const std::vector<int64_t>& load,
                                const std::vector<int>& placement,
                                int ep) {
    const auto n_exp = static_cast<int64_t>(load.size());
    std::vector<int64_t> sum(static_cast<size_t>(ep), 0);
    for (int64_t e = 0; e < n_exp; ++e)
        sum[static_cast<size_t>(expert_rank_of(placement, e, n_exp, ep))] += load[e];
    return sum;
}

}  // namespace

std::vector<int> balanced_placement(const std::vector<int64_t>& load, int ep) {
    const auto n_exp = static_cast<int>(load.size());
    HYMOE_CHECK(ep >= 1 && n_exp % ep == 0, "placement of ", n_exp, " experts over ", ep, " ranks");
    std::vector<int> order(static_cast<size_t>(n_exp));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return load[a] > load[b]; });
    std::vector<int64_t> sum(static_cast<size_t>(ep), 0);
    std::vector<int> free_slots(static_cast<size_t>(ep), n_exp / ep);
    std::vector<int> placement(static_cast<size_t>(n_exp), -1);
    for (int e : order) {
        int best = -1;
        for (int r = 0; r < ep; ++r)
            if (free_slots[r] > 0 && (best < 0 || sum[r] < sum[best]))
                best = r;
        placement[e] = best;
        sum[best] += load[e];
        --free_slots[best];
    }
    return placement;
}

double placement_imbalance(const std::vector<int64_t>& load,
                           const std::vector<int>& placement,
                           int ep) {
    const std::vector<int64_t> sum = rank_loads(load, placement, ep);
    const int64_t total = std::accumulate(sum.begin(), sum.end(), int64_t{0});
    if (total == 0)
        return 1.0;
    return static_cast<double>(*std::max_element(sum.begin(), sum.end())) /
           (static_cast<double>(total) / ep);
}

int place_experts(Model& m,
                  int layer,
                  const std::vector<int>& placement,
                  const std::function<void(const TensorList&)>& fill) {
    MoeWeights& w = m.layers[layer].moe;
    const std::vector<int> before = hosted_experts(m.local, m.shard, w.expert_rank);
    const std::vector<int> after = hosted_experts(m.local, m.shard, placement);
    std::vector<int> arriving;
    std::set_difference(
        after.begin(), after.end(), before.begin(), before.end(), std::back_inserter(arriving));
    for (int e : before)
        if (!std::binary_search(after.begin(), after.end(), e))
            w.experts[static_cast<size_t>(e)] = DenseFfnWeights{};
    w.expert_rank = placement;
    fill(expert_tensors(m, layer, arriving));
    return static_cast<int>(arriving.size());
}

}  // namespace hymoe::model
