// The vision path's host helpers and its entry points on host weights (model/vision.h): the
// patches, the position embedding, the token counts; rope_2d, vision_block, vision_pool,
// patch_merge, vision_project and vision_forward run the one forward's ops on a CPU context
// (model/vision_views.h, backend/ops_vision.h), on the Buffers' views.
#include "hymoe/model/vision.h"

#include <algorithm>

#include "hymoe/backend/ops_vision.h"
#include "hymoe/backend/resize.h"
#include "hymoe/core/error.h"
#include "hymoe/model/vision_plan.h"
#include "hymoe/model/vision_views.h"

namespace hymoe::model {

int64_t total_patches(const std::vector<VisionImage>& images) {
    int64_t n = 0;
    for (const VisionImage& im : images)
        n += im.grid_h * im.grid_w;
    return n;
}

int64_t vision_tokens(const VisionConfig& v, int64_t grid_h, int64_t grid_w, int pool) {
    const int64_t u = int64_t{v.merge} * pool;
    return (grid_h / u) * (grid_w / u);
}

int64_t checked_vision_tokens(const VisionConfig& v,
                              const std::vector<VisionImage>& images,
                              int pool) {
    HYMOE_CHECK(pool >= 1, "vision: pool ", pool);
    int64_t tokens = 0;
    for (const VisionImage& im : images) {
        const int64_t u = int64_t{v.merge} * pool;
        HYMOE_CHECK(im.grid_h % u == 0 && im.grid_w % u == 0 && im.grid_h > 0 && im.grid_w > 0,
                    "vision: grid ",
                    im.grid_h,
                    "x",
                    im.grid_w,
                    " is not a multiple of ",
                    u);
        tokens += vision_tokens(v, im.grid_h, im.grid_w, pool);
    }
    return tokens;
}

void patchify(const VisionConfig& v, const std::vector<VisionImage>& images, Tensor& patches) {
    const int64_t p = v.patch_size, row = 3 * p * p;
    HYMOE_CHECK(patches.dim(0) == total_patches(images) && patches.dim(1) == row,
                "patchify: patches ",
                patches.dim(0),
                "x",
                patches.dim(1));
    float* out = patches.ptr<float>();
    for (const VisionImage& im : images) {
        const int64_t H = im.grid_h * p, W = im.grid_w * p;
        for (int64_t gy = 0; gy < im.grid_h; ++gy)
            for (int64_t gx = 0; gx < im.grid_w; ++gx, out += row)
                for (int64_t c = 0; c < 3; ++c)
                    for (int64_t ky = 0; ky < p; ++ky)
                        std::copy_n(im.pixels + c * H * W + (gy * p + ky) * W + gx * p,
                                    p,
                                    out + (c * p + ky) * p);
    }
}

void add_position_embedding(
    const VisionConfig& v, const VisionWeights& w, int64_t grid_h, int64_t grid_w, Tensor& x) {
    const int64_t C = v.width, S = v.pos_emb_size;
    std::vector<float> pos(static_cast<size_t>(grid_h * grid_w * C));  // [h, w, C]
    ops::resize_bicubic(w.pos_emb.ptr<float>(), S, S, C, pos.data(), grid_h, grid_w);
    for (size_t i = 0; i < pos.size(); ++i)
        x.ptr<float>()[i] += pos[i];
}

void rope_2d(
    float* x, int64_t n, int64_t n_head, int64_t head_dim, int64_t token_stride, int64_t grid_w) {
    const std::vector<int32_t> pos =
        patch_positions({{(n + grid_w - 1) / grid_w, grid_w, nullptr}});
    ops::rope_2d(x, n, n_head, head_dim, token_stride, pos.data());
}

void vision_block(const VisionConfig& v,
                  const VisionBlockWeights& w,
                  const std::vector<VisionImage>& images,
                  Tensor& x) {
    std::vector<int32_t> where = patch_positions(images);
    const Tensor pos{where.data(), DType::i32, Device::cpu, {x.dim(0), 2}};
    std::vector<int64_t> lengths;
    for (const VisionImage& im : images)
        lengths.push_back(im.grid_h * im.grid_w);
    double flops = 0;
    vision_block(
        backend::cpu_ctx(), v, vision_block_views(v, w), lengths, pos, kVisionNoBudget, x, &flops);
}

namespace {

// out = ops::gather_mean_rows of x by rows [r, g] (pool_merge_rows).
void gather_means(std::vector<int64_t> rows, int64_t g, const Tensor& x, Tensor& out) {
    const Tensor idx{
        rows.data(), DType::i64, Device::cpu, {static_cast<int64_t>(rows.size()) / g, g}};
    Tensor o = out;  // [r, C]
    o.shape = {idx.dim(0), x.dim(1)};
    ops::gather_mean_rows(x, idx, o);
}

}  // namespace

void vision_pool(const std::vector<VisionImage>& images, int pool, const Tensor& x, Tensor& out) {
    gather_means(pool_merge_rows(images, pool, 1), int64_t{pool} * pool, x, out);
}

void patch_merge(
    const std::vector<VisionImage>& images, int pool, int merge, const Tensor& x, Tensor& out) {
    std::vector<VisionImage> pooled;  // the grids x holds
    for (const VisionImage& im : images)
        pooled.push_back({im.grid_h / pool, im.grid_w / pool, nullptr});
    gather_means(pool_merge_rows(pooled, 1, merge), 1, x, out);
}

void vision_project(const VisionConfig& v,
                    const VisionWeights& w,
                    const Tensor& merged,
                    Tensor& out) {
    Buffer normed(DType::f32, merged.shape);  // the projector norms its input in place
    std::copy_n(merged.ptr<float>(), merged.numel(), normed.ptr<float>());
    ModelConfig cfg;  // what the weight list needs: the tower and the width d
    cfg.vision = v;
    cfg.hidden_size = out.dim(1);
    double flops = 0;
    vision_project(backend::cpu_ctx(), v, vision_views(cfg, w), normed.view(), out, &flops);
}

void vision_forward(const ModelConfig& cfg,
                    const VisionWeights& w,
                    const std::vector<VisionImage>& images,
                    int pool,
                    Tensor& out,
                    VisionStats* stats) {
    PositionTables positions(cfg.vision, w.pos_emb.view(), 0);  // no table kept between calls
    vision_forward(backend::cpu_ctx(),
                   cfg,
                   vision_views(cfg, w),
                   positions,
                   images,
                   pool,
                   kVisionNoBudget,
                   out,
                   stats);
}

}  // namespace hymoe::model
