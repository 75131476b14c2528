// Expert rebalancing every parallel.rebalance_every engine ticks (runtime/rebalance.h).
#include "hymoe/runtime/rebalance.h"

#include <cstdio>

#include "hymoe/core/error.h"
#include "hymoe/core/log.h"
#include "hymoe/model/eplb.h"

namespace hymoe::runtime {

ExpertRebalancer::ExpertRebalancer(const Job& job,
                                   const parallel::Grid& grid,
                                   model::Model& m,
                                   const model::ForwardStats& stats,
                                   WeightFill fill,
                                   model::DeviceModel* device)
    : job_(job),
      grid_(grid),
      m_(m),
      stats_(stats),
      fill_(std::move(fill)),
      device_(device),
      seen_(job.model.layers.size() * static_cast<size_t>(job.model.moe.n_routed_experts), 0),
      placement_(job.model.layers.size()) {}

void ExpertRebalancer::operator()() {
    const auto L = static_cast<int64_t>(job_.model.layers.size());
    const int64_t E = job_.model.moe.n_routed_experts;
    const int ep = job_.layout.ep;
    std::vector<int64_t> total(static_cast<size_t>(L * E), 0);  // [L, E] this rank's counts
    for (int64_t i = 0; i < L && i < static_cast<int64_t>(stats_.moe.size()); ++i)
        for (size_t e = 0; e < stats_.moe[i].tokens_per_expert.size(); ++e)
            total[i * E + static_cast<int64_t>(e)] = stats_.moe[i].tokens_per_expert[e];
    Tensor t{total.data(), DType::i64, Device::cpu, {L * E}};
    comm::all_reduce(t, grid_.comms.world);
    double measured = 0, predicted = 0;
    int n_layers = 0, moved = 0;
    for (int64_t i = 0; i < L; ++i) {
        if (job_.model.layers[i].ffn == model::Ffn::dense)
            continue;
        std::vector<int64_t> window(static_cast<size_t>(E));  // this window's assignments
        for (int64_t e = 0; e < E; ++e)
            window[e] = total[i * E + e] - seen_[i * E + e];
        const double now = model::placement_imbalance(window, placement_[i], ep);
        std::vector<int> better = model::balanced_placement(window, ep);
        const double then = model::placement_imbalance(window, better, ep);
        measured += now, ++n_layers;
        if (then >= 0.99 * now) {
            predicted += now;
            continue;
        }
        predicted += then;
        for (int64_t e = 0; e < E; ++e)
            moved += model::expert_rank_of(placement_[i], e, E, ep) != better[e];
        if (m_.shard.owns_layer(static_cast<int>(i))) {
            model::place_experts(m_, static_cast<int>(i), better, fill_);
            if (device_ != nullptr)
                device_->place_experts(m_, static_cast<int>(i));
        }
        placement_[i] = std::move(better);
    }
    seen_ = std::move(total);
    if (n_layers == 0)
        return;
    measured /= n_layers, predicted /= n_layers;
    measured_.push_back(measured);
    moved_ += moved;
    adopted_ += moved > 0;
    char line[200];
    std::snprintf(line,
                  sizeof line,
                  "experts rebalanced: imbalance of the last window %.3f (mean over %d MoE "
                  "layers), %.3f under the new placement; %d experts moved",
                  measured,
                  n_layers,
                  predicted,
                  moved);
    log::info(line);
}

std::string ExpertRebalancer::summary() const {
    if (measured_.empty())
        return "expert rebalancing: no window completed";
    double after = 0;
    for (size_t w = 1; w < measured_.size(); ++w)
        after += measured_[w];
    char line[240];
    std::snprintf(line,
                  sizeof line,
                  "expert rebalancing: %zu windows, %lld placements adopted, %lld experts moved; "
                  "measured imbalance %.3f in the first window (contiguous placement), %.3f "
                  "over the later ones",
                  measured_.size(),
                  static_cast<long long>(adopted_),
                  static_cast<long long>(moved_),
                  measured_.front(),
                  measured_.size() > 1 ? after / static_cast<double>(measured_.size() - 1) : 0.0);
    return line;
}

}  // namespace hymoe::runtime
