// Best evaluation and early-stopping count (runtime/eval_watch.h).
#include "hymoe/runtime/eval_watch.h"

#include <cmath>

namespace hymoe::runtime {

bool EvalWatch::add(int64_t step, double value) {
    if (step == 0)
        return false;
    if (best_step < 0 && !std::isnan(value)) {  // the first measured evaluation
        best = value, best_step = step, stale = 0;
        return true;
    }
    const bool improved = best_step >= 0 && value < best - min_delta;
    const bool is_best = best_step >= 0 && value < best;
    stale = improved ? 0 : stale + 1;
    if (is_best)
        best = value, best_step = step;
    return is_best;
}

}  // namespace hymoe::runtime
