// The lora job's evaluation and routing-drift monitoring (private to src/runtime): fixed eval
// rows read in file order, their loss and accuracy summed over the dp replicas, and the drift of
// every MoE layer's router distribution against the base model's.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "hymoe/model/train.h"
#include "hymoe/parallel/grid.h"
#include "hymoe/runtime/train_data.h"

namespace hymoe::runtime {

// The fixed evaluation rows of one file: its first `rows` packed rows in file order (none for an
// empty path).
struct EvalSet {
    std::optional<DocStream> stream;
    std::vector<RowPlan> rows;
};
EvalSet eval_set(const std::string& path, int64_t rows, int64_t seq_len);

// Loss sums over an eval set: each replica takes every dp-th micro-batch, summed over dp.
model::LossSums evaluate(const model::TrainOn& on,
                         const EvalSet& e,
                         int64_t seq_len,
                         int64_t micro,
                         const parallel::Grid& grid);

// Per MoE layer l (layers[l] indexes base and now, [n_tok, E] each): the mean over tokens of the
// top-k overlap |topk(p_base) ∩ topk(p)| / k → overlap[l], and of KL(p_base ‖ p) → kl[l]; 0 for
// a layer of another pipeline stage (empty entries).
void drift(const std::vector<Buffer>& base,
           const std::vector<Buffer>& now,
           const std::vector<int64_t>& layers,
           int64_t k,
           double* overlap,
           double* kl);

}  // namespace hymoe::runtime
