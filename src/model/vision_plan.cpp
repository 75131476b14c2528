// The vision forward's host-side index math (model/vision_plan.h).
#include "hymoe/model/vision_plan.h"

#include <algorithm>

#include "hymoe/backend/ops_vision.h"
#include "hymoe/backend/resize.h"
#include "hymoe/core/error.h"

namespace hymoe::model {

std::vector<VisionPass> vision_passes(const std::vector<VisionImage>& images,
                                      int64_t row_bytes,
                                      int64_t budget) {
    std::vector<VisionPass> passes;
    int64_t patches = 0, widest = 0;
    for (size_t i = 0; i < images.size(); ++i) {
        const int64_t m = images[i].grid_h * images[i].grid_w;
        const int64_t wide = std::max(widest, m);
        const bool fits = (patches + m) * row_bytes + 4 * wide * wide <= budget;
        if (passes.empty() || !fits) {
            passes.push_back({i, 1});
            patches = m, widest = m;
        } else {
            ++passes.back().count;
            patches += m, widest = wide;
        }
    }
    return passes;
}

int64_t vision_heads_at_once(int64_t patches, int64_t n_head, int64_t free_bytes) {
    return ops::heads_at_once(patches, n_head, free_bytes);
}

std::vector<int32_t> patch_positions(const std::vector<VisionImage>& images) {
    std::vector<int32_t> pos;
    for (const VisionImage& im : images)
        for (int64_t t = 0; t < im.grid_h * im.grid_w; ++t) {
            pos.push_back(static_cast<int32_t>(t / im.grid_w));
            pos.push_back(static_cast<int32_t>(t % im.grid_w));
        }
    return pos;
}

std::vector<int64_t> pool_merge_rows(const std::vector<VisionImage>& images, int pool, int merge) {
    const int64_t u = pool, m = merge;
    std::vector<int64_t> rows;
    int64_t off = 0;  // the image's first patch
    for (const VisionImage& im : images) {
        const int64_t h = im.grid_h / u, w = im.grid_w / u;  // the pooled grid
        for (int64_t r = 0; r < h / m; ++r)
            for (int64_t c = 0; c < w / m; ++c)
                for (int64_t ih = 0; ih < m; ++ih)
                    for (int64_t iw = 0; iw < m; ++iw)
                        for (int64_t dy = 0; dy < u; ++dy)
                            for (int64_t dx = 0; dx < u; ++dx)
                                rows.push_back(off + ((r * m + ih) * u + dy) * im.grid_w +
                                               (c * m + iw) * u + dx);
        off += im.grid_h * im.grid_w;
    }
    return rows;
}

PositionTables::PositionTables(const VisionConfig& v, const VisionWeights& w, int64_t max_bytes)
    : PositionTables(v, w.pos_emb.view(), max_bytes) {
    own_.assign(table_, table_ + side_ * side_ * width_);
    table_ = own_.data();
}

PositionTables::PositionTables(const VisionConfig& v, const Tensor& table, int64_t max_bytes)
    : side_(v.pos_emb_size), width_(v.width), max_bytes_(max_bytes), table_(table.ptr<float>()) {
    HYMOE_CHECK(table.device == Device::cpu && table.dtype == DType::f32 &&
                    table.numel() == side_ * side_ * width_,
                "vision: position table of ",
                table.numel(),
                " values for a side of ",
                side_,
                " and width ",
                width_);
}

const std::vector<float>& PositionTables::get(int64_t grid_h, int64_t grid_w) {
    const auto key = std::make_pair(grid_h, grid_w);
    auto it = kept_.find(key);
    if (it != kept_.end())
        return it->second;
    const int64_t bytes = grid_h * grid_w * width_ * int64_t{sizeof(float)};
    if (kept_bytes_ + bytes > max_bytes_) {
        kept_.clear();
        kept_bytes_ = 0;
    }
    std::vector<float> pos(static_cast<size_t>(grid_h * grid_w * width_));  // [h, w, C]
    ops::resize_bicubic(table_, side_, side_, width_, pos.data(), grid_h, grid_w);
    kept_bytes_ += bytes;
    return kept_[key] = std::move(pos);
}

}  // namespace hymoe::model
