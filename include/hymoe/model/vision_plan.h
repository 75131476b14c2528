// The host side of the one vision forward (model/vision_views.h, on the CPU and on the GPU model's
// device): passes of consecutive images whose activations fit a byte budget, the attention's heads
// at once per image, every patch's grid position for the 2-D RoPE, the rows whose means are the
// pooled and merged features, and the bicubic position tables by grid, cached. Plain C++ in every
// build, unit-tested on the host.
#pragma once

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "hymoe/model/config.h"
#include "hymoe/model/vision.h"

namespace hymoe::model {

// Images [first, first + count) of a batch, encoded together.
struct VisionPass {
    size_t first = 0, count = 0;
};

// Consecutive passes, in order, over every image: a pass takes images while its patches ·
// row_bytes plus one head's scores of its widest image (4·m² bytes, m = h·w) stay within budget;
// an image over the budget alone is a pass of its own.
std::vector<VisionPass> vision_passes(const std::vector<VisionImage>& images,
                                      int64_t row_bytes,
                                      int64_t budget);

// Heads whose fp32 scores [m, m] fit in free_bytes at once, between 1 and n_head
// (ops::heads_at_once, the rule the attention's CUDA form takes its heads by).
int64_t vision_heads_at_once(int64_t patches, int64_t n_head, int64_t free_bytes);

// [Σ h·w, 2] int32: (row, column) of every patch in its own image's grid, image after image
// (patch t of an image of width w at row t / w, column t mod w, as model::rope_2d).
std::vector<int32_t> patch_positions(const std::vector<VisionImage>& images);

// [Σ h·w / pool², pool²] int64: the rows of the tower's output x [Σ h·w, C] whose mean (in this
// order) is each row of the pooled and merged features viewed as [Σ h·w / pool², C]
// (model::vision_pool then patch_merge: merged token after merged token, its m² slots in order,
// a slot's pool × pool cell row-major).
std::vector<int64_t> pool_merge_rows(const std::vector<VisionImage>& images, int pool, int merge);

// bicubic(pos_emb → [h, w, C]) (model::add_position_embedding's table) by grid, computed once
// and kept while the kept tables stay within max_bytes (all dropped when a new one would not
// fit). The first form holds its own copy of the position table, so the host weights may go; the
// second reads `table` (host f32 [S, S, C]), which must outlive it.
class PositionTables {
public:
    PositionTables(const VisionConfig& v, const VisionWeights& w, int64_t max_bytes);
    PositionTables(const VisionConfig& v, const Tensor& table, int64_t max_bytes);
    PositionTables(const PositionTables&) = delete;
    PositionTables& operator=(const PositionTables&) = delete;
    // [h·w, C]; valid until the next call.
    const std::vector<float>& get(int64_t grid_h, int64_t grid_w);
    int64_t kept_bytes() const { return kept_bytes_; }

private:
    int64_t side_ = 0, width_ = 0, max_bytes_ = 0, kept_bytes_ = 0;
    std::vector<float> own_;        // [S, S, C] the first form's copy
    const float* table_ = nullptr;  // [S, S, C]
    std::map<std::pair<int64_t, int64_t>, std::vector<float>> kept_;
};

}  // namespace hymoe::model
