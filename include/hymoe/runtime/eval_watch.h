// The lora job's view of its evaluation metric over the run (finetune.eval.metric): the best value
// so far and its step (checkpoints/best, adapters/best) and the evaluations since it improved by
// more than min_delta (finetune.early_stopping), with the semantics of HF Trainer's
// EarlyStoppingCallback: the best is the strict minimum (the first of equal values), and an
// evaluation resets the count only when it lowers the previous best by more than min_delta.
// Step 0's evaluation (the base model) is neither a best nor counted. The whole state follows from
// the evaluations in order, so a resumed job replays its history into a fresh EvalWatch.
#pragma once

#include <cstdint>

namespace hymoe::runtime {

struct EvalWatch {
    int patience = 0;  // 0: never stop
    double min_delta = 0;
    double best = 0;
    int64_t best_step = -1;  // -1: no evaluation after step 0 yet
    int64_t stale = 0;       // evaluations since the last improvement by more than min_delta

    // Takes the evaluation at `step`; true when it is a new best (a NaN never is).
    bool add(int64_t step, double value);
    bool should_stop() const { return patience > 0 && stale >= patience; }
};

}  // namespace hymoe::runtime
