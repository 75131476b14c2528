// DecodeBuckets (hymoe/backend/cuda_graph.h): the batch sizes decode graphs are captured at and
// the choice of one for a batch. Plain C++ in every build (tests/unit/backend).
#include <algorithm>

#include "hymoe/backend/cuda_graph.h"
#include "hymoe/core/error.h"

namespace hymoe::backend::cuda {

DecodeBuckets::DecodeBuckets(int max_batch) {
    HYMOE_CHECK(max_batch >= 1, "decode buckets: max batch ", max_batch);
    for (int b = 1; b < max_batch; b *= 2)
        sizes_.push_back(b);
    sizes_.push_back(max_batch);
}

DecodeBuckets::DecodeBuckets(std::vector<int> sizes) : sizes_(std::move(sizes)) {
    std::sort(sizes_.begin(), sizes_.end());
    sizes_.erase(std::unique(sizes_.begin(), sizes_.end()), sizes_.end());
    HYMOE_CHECK(!sizes_.empty() && sizes_.front() >= 1,
                "decode buckets: need sizes ≥ 1, got ",
                sizes_.size(),
                " sizes");
}

int DecodeBuckets::index_for(int n) const {
    HYMOE_CHECK(
        n >= 1 && n <= max(), "decode buckets: a batch of ", n, " (buckets up to ", max(), ")");
    return static_cast<int>(std::lower_bound(sizes_.begin(), sizes_.end(), n) - sizes_.begin());
}

}  // namespace hymoe::backend::cuda
