// The one vision forward (model/vision_views.h) as ops on a Ctx: per pass of images, the host
// patchifies them and looks up their position tables, then on ctx's device the patch embedding,
// the ViT blocks (attention image by image over its own patches, ops::vision_attention), the
// final norm, the pooling + merge (one gather of row means) and the projector; the tokens come
// back to the host. On a CPU context every step is the host tower's own loop, bit for bit.
#include <algorithm>
#include <vector>

#include "hymoe/backend/ops.h"
#include "hymoe/backend/ops_attention.h"
#include "hymoe/backend/ops_vision.h"
#include "hymoe/core/error.h"
#include "hymoe/core/timer.h"
#include "hymoe/model/vision_views.h"

namespace hymoe::model {

namespace {

constexpr float kLnEps = 1e-5f;  // every LayerNorm of the tower and projector

// y = act(x · wᵀ + b), counting its GEMM FLOPs in *flops.
void dense(const backend::Ctx& ctx,
           const Tensor& x,
           const Tensor& w,
           const Tensor& b,
           ops::BiasAct act,
           Tensor& y,
           double* flops) {
    ops::linear_bias(ctx, x, w, b, act, y);
    *flops += 2.0 * static_cast<double>(y.dim(0)) * static_cast<double>(w.dim(0)) *
              static_cast<double>(w.dim(1));
}

// Bytes of activations a patch of a pass holds at the widest point, scores aside; cast: the bytes
// of an element's copy in the matrices' dtype (0 for f32 matrices, which take f32 rows as they
// are).
int64_t row_bytes(const VisionConfig& v, int64_t d, int64_t cast) {
    const int64_t C = v.width, M = v.mlp, pp = 3 * int64_t{v.patch_size} * v.patch_size;
    const int64_t embed = 4 * pp + cast * pp + 4 * C;            // patches, cast, positions
    const int64_t block = 4 * (6 * C + M) + cast * (3 * C + M);  // xn qkv o y f, casts
    const int64_t project = 4 * (2 * C + d) + 2 * cast * C + 8;  // merged, hidden, out, rows
    return 4 * C + 8 + std::max({embed, block, project});        // + x and the RoPE positions
}

// A device copy in s of host values v (host tensor of shape `shape`).
template <class T>
Tensor uploaded(const backend::Ctx& ctx,
                backend::Scratch& s,
                const std::vector<T>& v,
                DType dtype,
                Shape shape) {
    const Tensor host{const_cast<T*>(v.data()), dtype, Device::cpu, shape};
    Tensor t = s(dtype, std::move(shape));
    ops::upload(ctx, host, t);
    return t;
}

// One pass: out [its tokens, d] f32 on the host; returns the bytes of activations it held.
int64_t encode_pass(const backend::Ctx& ctx,
                    const ModelConfig& cfg,
                    const VisionWeightViews& w,
                    PositionTables& positions,
                    const std::vector<VisionImage>& images,
                    int pool,
                    int64_t scratch_bytes,
                    int64_t bytes_a_row,
                    Tensor& out,
                    double* flops) {
    const VisionConfig& v = cfg.vision;
    const int64_t C = v.width, pp = 3 * int64_t{v.patch_size} * v.patch_size;
    const int64_t m2 = int64_t{v.merge} * v.merge, g = int64_t{pool} * pool;
    const int64_t n = total_patches(images), np = n / g, tokens = np / m2;
    backend::Scratch s(ctx);
    Tensor x = s(DType::f32, {n, C});
    // host tensors stay until the pass's last synchronisation (the download)
    Buffer patches(DType::f32, {n, pp}), table(DType::f32, {n, C});
    patchify(v, images, patches.view());
    std::vector<int64_t> lengths;  // each image's patches
    int64_t off = 0;
    for (const VisionImage& im : images) {
        const std::vector<float>& t = positions.get(im.grid_h, im.grid_w);  // [h·w, C]
        std::copy(t.begin(), t.end(), table.ptr<float>() + off * C);
        lengths.push_back(im.grid_h * im.grid_w);
        off += lengths.back();
    }
    {  // x = patches · W_pᵀ + b_p + positions
        backend::Scratch e(ctx);
        Tensor dev_patches = e(DType::f32, {n, pp}), dev_table = e(DType::f32, {n, C});
        ops::upload(ctx, patches.view(), dev_patches);
        ops::upload(ctx, table.view(), dev_table);
        Tensor patch_w = w.patch_w;  // [C, 3, p, p] as [C, 3·p·p]
        patch_w.shape = {C, pp};
        dense(ctx, dev_patches, patch_w, w.patch_b, ops::BiasAct::none, x, flops);
        ops::add_inplace(ctx, x, dev_table);
    }
    const std::vector<int32_t> where = patch_positions(images);
    const Tensor rope_pos = uploaded(ctx, s, where, DType::i32, {n, 2});
    const int64_t scores_bytes = std::max<int64_t>(scratch_bytes - n * bytes_a_row, 0);
    int64_t scores_floats = 0;
    for (int64_t m : lengths)
        scores_floats = std::max(scores_floats,
                                 ops::vision_heads_at_once(ctx, m, v.n_head, scores_bytes) * m * m);
    for (const VisionBlockViews& b : w.blocks)
        vision_block(ctx, v, b, lengths, rope_pos, scores_bytes, x, flops);
    ops::layer_norm(ctx, x, w.final_w, w.final_b, kLnEps, x);
    // pooled and merged [np, C] = [tokens, m²C], then the projector
    const std::vector<int64_t> gather = pool_merge_rows(images, pool, v.merge);
    const Tensor rows = uploaded(ctx, s, gather, DType::i64, {np, g});
    Tensor merged = s(DType::f32, {np, C}), y = s(DType::f32, {tokens, cfg.hidden_size});
    ops::gather_mean_rows(ctx, x, rows, merged);
    merged.shape = {tokens, m2 * C};
    vision_project(ctx, v, w, merged, y, flops);
    ops::download(ctx, y, out);
    return n * bytes_a_row + scores_floats * 4;
}

}  // namespace

void vision_block(const backend::Ctx& ctx,
                  const VisionConfig& v,
                  const VisionBlockViews& w,
                  const std::vector<int64_t>& lengths,
                  const Tensor& rope_pos,
                  int64_t scores_bytes,
                  Tensor& x,
                  double* flops) {
    const int64_t n = x.dim(0), C = v.width, H = v.n_head, M = v.mlp;
    backend::Scratch s(ctx);
    Tensor xn = s(DType::f32, {n, C}), qkv = s(DType::f32, {n, 3 * C});
    Tensor o = s(DType::f32, {n, C}), y = s(DType::f32, {n, C}), f = s(DType::f32, {n, M});
    ops::layer_norm(ctx, x, w.norm0_w, w.norm0_b, kLnEps, xn);
    dense(ctx, xn, w.wqkv_w, w.wqkv_b, ops::BiasAct::none, qkv, flops);  // [n, 3, H, dh]
    ops::rope_2d(ctx, qkv, 2 * H, C / H, rope_pos);  // q and k: 2H heads side by side
    ops::vision_attention(ctx, qkv, lengths, H, scores_bytes, o);
    for (int64_t m : lengths)  // two GEMMs of 2·m·m·dh a head
        *flops += 4.0 * static_cast<double>(m) * static_cast<double>(m) * static_cast<double>(C);
    dense(ctx, o, w.wo_w, w.wo_b, ops::BiasAct::none, y, flops);
    ops::add_inplace(ctx, x, y);
    ops::layer_norm(ctx, x, w.norm1_w, w.norm1_b, kLnEps, xn);
    dense(ctx, xn, w.fc0_w, w.fc0_b, ops::BiasAct::gelu_tanh, f, flops);
    dense(ctx, f, w.fc1_w, w.fc1_b, ops::BiasAct::none, y, flops);
    ops::add_inplace(ctx, x, y);
}

void vision_project(const backend::Ctx& ctx,
                    const VisionConfig& v,
                    const VisionWeightViews& w,
                    Tensor& merged,
                    Tensor& out,
                    double* flops) {
    const int64_t n = merged.dim(0), C4 = merged.dim(1), C = v.width;
    Tensor slots = merged;  // [n·m², C]
    slots.shape = {n * C4 / C, C};
    ops::layer_norm(ctx, slots, w.proj_norm_w, w.proj_norm_b, kLnEps, slots);
    backend::Scratch s(ctx);
    Tensor hidden = s(DType::f32, {n, C4});
    dense(ctx, merged, w.linear_1_w, w.linear_1_b, ops::BiasAct::gelu_erf, hidden, flops);
    dense(ctx, hidden, w.linear_2_w, w.linear_2_b, ops::BiasAct::none, out, flops);
}

void vision_forward(const backend::Ctx& ctx,
                    const ModelConfig& cfg,
                    const VisionWeightViews& w,
                    PositionTables& positions,
                    const std::vector<VisionImage>& images,
                    int pool,
                    int64_t scratch_bytes,
                    Tensor& out,
                    VisionStats* stats) {
    const double t0 = wall_seconds();
    const VisionConfig& v = cfg.vision;
    const int64_t d = cfg.hidden_size, tokens = checked_vision_tokens(v, images, pool);
    HYMOE_CHECK(out.device == Device::cpu && out.dtype == DType::f32 && out.shape.size() == 2 &&
                    out.dim(0) == tokens && out.dim(1) == d,
                "vision: out ",
                to_string(out.dtype),
                shape_string(out.shape),
                " for ",
                tokens,
                " tokens of width ",
                d);
    const int64_t cast =
        w.linear_1_w.dtype == DType::f32 ? 0 : static_cast<int64_t>(dtype_size(w.linear_1_w.dtype));
    const int64_t bytes_a_row = row_bytes(v, d, cast);
    double flops = 0;
    int64_t row = 0, peak = 0;
    for (const VisionPass& p : vision_passes(images, bytes_a_row, scratch_bytes)) {
        const auto first = images.begin() + static_cast<std::ptrdiff_t>(p.first);
        const std::vector<VisionImage> part(first, first + static_cast<std::ptrdiff_t>(p.count));
        const int64_t part_tokens = checked_vision_tokens(v, part, pool);
        Tensor rows = out.rows(row, part_tokens);
        peak = std::max(
            peak,
            encode_pass(
                ctx, cfg, w, positions, part, pool, scratch_bytes, bytes_a_row, rows, &flops));
        row += part_tokens;
    }
    if (!stats)
        return;
    stats->images += static_cast<int64_t>(images.size());
    stats->patches += total_patches(images);
    stats->tokens += tokens;
    stats->seconds += wall_seconds() - t0;
    stats->flops += flops;
    stats->peak_act_bytes = std::max(stats->peak_act_bytes, peak);
}

}  // namespace hymoe::model
