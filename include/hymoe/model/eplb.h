// Expert placement rebalancing (EPLB-style; moves only, no replicas). Under ep each rank hosts E/ep
// routed experts; routing skew makes some ranks compute far more assignments than others, and the
// layer waits for the busiest. Every parallel.rebalance_every engine ticks the job sums the
// assignments every expert computed over the last window, computes a placement that balances
// them, and moves the experts whose rank changed: a rank frees the experts it gives up and fills
// the ones it receives from the weight source (the checkpoint slice, or the same random stream),
// so the values are bit-identical wherever an expert lives. Results do not depend on placement:
// a token's experts, weights and slot-ordered sum are the same; only where they run changes.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "hymoe/model/model.h"

namespace hymoe::model {

// A placement [E] → ep rank, E/ep experts per rank, balancing the ranks' summed loads: experts by
// load descending (ties: lower id) each go to the rank with the least load so far among those
// with a free slot (ties: lower rank): greedy longest-processing-time.
std::vector<int> balanced_placement(const std::vector<int64_t>& load /*[E]*/, int ep);

// max/mean over the ep ranks of their summed loads under placement (empty: rank e/(E/ep));
// 1 when there is no load.
double placement_imbalance(const std::vector<int64_t>& load /*[E]*/,
                           const std::vector<int>& placement,
                           int ep);

// Moves MoE layer `layer` of this rank's stage to `placement`: frees the experts this rank no
// longer hosts and calls fill() on the tensors of the ones it now hosts. Returns their number.
int place_experts(Model& m,
                  int layer,
                  const std::vector<int>& placement,
                  const std::function<void(const TensorList&)>& fill);

}  // namespace hymoe::model
