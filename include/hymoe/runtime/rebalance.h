// Expert rebalancing of an infer job (parallel.rebalance_every, model/eplb.h): every call sums the
// assignments each routed expert computed since the previous call over all ranks, measures the
// window's imbalance (max/mean over the ep ranks) under the placement it ran with, and, where the
// balanced placement of that window's loads would cut it by more than 1%, adopts it: every rank
// computes the same placement and moves its stage's experts (on the host model, and on its GPU's
// model when it runs there). The log gets one line per call and
// a closing summary: the measured imbalance of the first window (the contiguous placement)
// against the windows after.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hymoe/model/device_model.h"
#include "hymoe/model/model.h"
#include "hymoe/parallel/comms.h"
#include "hymoe/runtime/engine.h"
#include "hymoe/runtime/job.h"

namespace hymoe::runtime {

class ExpertRebalancer {
public:
    // stats: the engine's ForwardStats (its per-layer tokens_per_expert are read, never reset);
    // device (null: none): the model on the rank's GPU made from m, whose experts follow m's.
    ExpertRebalancer(const Job& job,
                     const parallel::Grid& grid,
                     model::Model& m,
                     const model::ForwardStats& stats,
                     WeightFill fill,
                     model::DeviceModel* device);
    void operator()();  // collective over the world
    std::string summary() const;

private:
    const Job& job_;
    const parallel::Grid& grid_;
    model::Model& m_;
    const model::ForwardStats& stats_;
    WeightFill fill_;
    model::DeviceModel* device_;
    std::vector<int64_t> seen_;                // [n_layer, E] totals at the previous call
    std::vector<std::vector<int>> placement_;  // [n_layer] current placement (empty: blocks)
    std::vector<double> measured_;             // mean measured imbalance of every window
    int64_t moved_ = 0, adopted_ = 0;
};

}  // namespace hymoe::runtime
