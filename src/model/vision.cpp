// The MoonViT tower, pooling, patch merger and projector on packed images (model/vision.h,
// model-math §8). Attention runs image by image and head by head as two GEMMs over the image's
// patches (bidirectional, no mask), so packing never lets one image see another.
#include "hymoe/model/vision.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "hymoe/backend/ops.h"
#include "hymoe/backend/resize.h"
#include "hymoe/core/error.h"
#include "hymoe/core/timer.h"

namespace hymoe::model {

namespace {

constexpr float kLnEps = 1e-5f;  // every LayerNorm of the tower and projector

Tensor as_matrix(const Buffer& b, int64_t rows, int64_t cols) {
    Tensor t = b.view();
    t.shape = {rows, cols};
    return t;
}

// y [n, out] = x [n, in] · wᵀ + b
void linear_bias(const Tensor& x, const Buffer& w, const Buffer& b, Tensor& y) {
    ops::linear(x, w.view(), y);
    const int64_t n = y.dim(0), out = y.dim(1);
    for (int64_t r = 0; r < n; ++r)
        for (int64_t j = 0; j < out; ++j)
            y.ptr<float>()[r * out + j] += b.ptr<float>()[j];
}

float gelu_tanh(float x) {
    const float k = 0.7978845608028654f;  // sqrt(2/π)
    return 0.5f * x * (1.0f + std::tanh(k * (x + 0.044715f * x * x * x)));
}

float gelu_erf(float x) {
    return 0.5f * x * (1.0f + std::erf(x * 0.7071067811865476f));
}

}  // namespace

int64_t total_patches(const std::vector<VisionImage>& images) {
    int64_t n = 0;
    for (const VisionImage& im : images)
        n += im.grid_h * im.grid_w;
    return n;
}

TensorList vision_tensors(const ModelConfig& cfg, VisionWeights* w) {
    const VisionConfig& v = cfg.vision;
    const int64_t C = v.width, p = v.patch_size, M = v.mlp, S = v.pos_emb_size;
    const int64_t C4 = int64_t{v.merge} * v.merge * C, d = cfg.hidden_size;
    const std::string t = "vision_tower.", b = t + "encoder.blocks.";
    using V = VisionWeights;
    using B = VisionBlockWeights;
    TensorList list = {
        {t + "patch_embed.proj.weight", {C, 3, p, p}, slot(w, &V::patch_w)},
        {t + "patch_embed.proj.bias", {C}, slot(w, &V::patch_b), Init::zeros},
        {t + "patch_embed.pos_emb.weight", {S, S, C}, slot(w, &V::pos_emb)},
    };
    if (w)
        w->blocks.resize(static_cast<size_t>(v.n_layer));
    for (int i = 0; i < v.n_layer; ++i) {
        VisionBlockWeights* k = w ? &w->blocks[static_cast<size_t>(i)] : nullptr;
        const std::string q = b + std::to_string(i) + ".";
        list.push_back({q + "norm0.weight", {C}, slot(k, &B::norm0_w), Init::ones});
        list.push_back({q + "norm0.bias", {C}, slot(k, &B::norm0_b), Init::zeros});
        list.push_back({q + "wqkv.weight", {3 * C, C}, slot(k, &B::wqkv_w)});
        list.push_back({q + "wqkv.bias", {3 * C}, slot(k, &B::wqkv_b), Init::zeros});
        list.push_back({q + "wo.weight", {C, C}, slot(k, &B::wo_w)});
        list.push_back({q + "wo.bias", {C}, slot(k, &B::wo_b), Init::zeros});
        list.push_back({q + "norm1.weight", {C}, slot(k, &B::norm1_w), Init::ones});
        list.push_back({q + "norm1.bias", {C}, slot(k, &B::norm1_b), Init::zeros});
        list.push_back({q + "mlp.fc0.weight", {M, C}, slot(k, &B::fc0_w)});
        list.push_back({q + "mlp.fc0.bias", {M}, slot(k, &B::fc0_b), Init::zeros});
        list.push_back({q + "mlp.fc1.weight", {C, M}, slot(k, &B::fc1_w)});
        list.push_back({q + "mlp.fc1.bias", {C}, slot(k, &B::fc1_b), Init::zeros});
    }
    const std::string pr = "multi_modal_projector.";
    TensorList tail = {
        {t + "encoder.final_layernorm.weight", {C}, slot(w, &V::final_w), Init::ones},
        {t + "encoder.final_layernorm.bias", {C}, slot(w, &V::final_b), Init::zeros},
        {pr + "pre_norm.weight", {C}, slot(w, &V::proj_norm_w), Init::ones},
        {pr + "pre_norm.bias", {C}, slot(w, &V::proj_norm_b), Init::zeros},
        {pr + "linear_1.weight", {C4, C4}, slot(w, &V::linear_1_w)},
        {pr + "linear_1.bias", {C4}, slot(w, &V::linear_1_b), Init::zeros},
        {pr + "linear_2.weight", {d, C4}, slot(w, &V::linear_2_w)},
        {pr + "linear_2.bias", {d}, slot(w, &V::linear_2_b), Init::zeros},
    };
    list.insert(list.end(), tail.begin(), tail.end());
    return in_block(WeightBlock::vision, std::move(list));
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
    const int64_t quarter = head_dim / 4;
    std::vector<float> theta(static_cast<size_t>(quarter));
    for (int64_t i = 0; i < quarter; ++i)
        theta[i] = static_cast<float>(
            std::pow(10000.0, -4.0 * static_cast<double>(i) / static_cast<double>(head_dim)));
    for (int64_t t = 0; t < n; ++t) {
        const float row = static_cast<float>(t / grid_w), col = static_cast<float>(t % grid_w);
        for (int64_t j = 0; j < head_dim / 2; ++j) {  // pair j: 2i by column, 2i+1 by row
            const float angle = (j % 2 == 0 ? col : row) * theta[j / 2];
            const float c = std::cos(angle), s = std::sin(angle);
            for (int64_t h = 0; h < n_head; ++h) {
                float* e = x + t * token_stride + h * head_dim + 2 * j;
                const float a = e[0], b = e[1];
                e[0] = a * c - b * s;
                e[1] = a * s + b * c;
            }
        }
    }
}

void vision_block(const VisionConfig& v,
                  const VisionBlockWeights& w,
                  const std::vector<VisionImage>& images,
                  Tensor& x) {
    const int64_t n = x.dim(0), C = v.width, H = v.n_head, dh = C / H, M = v.mlp;
    Buffer xn(DType::f32, {n, C}), qkv(DType::f32, {n, 3 * C}), o(DType::f32, {n, C});
    Buffer y(DType::f32, {n, C});
    ops::layer_norm(x, w.norm0_w.view(), w.norm0_b.view(), kLnEps, xn.view());
    linear_bias(xn.view(), w.wqkv_w, w.wqkv_b, qkv.view());  // [n, 3, H, dh]
    const float scale = 1.0f / std::sqrt(static_cast<float>(dh));
    int64_t off = 0;
    for (const VisionImage& im : images) {
        const int64_t m = im.grid_h * im.grid_w;
        float* q = qkv.ptr<float>() + off * 3 * C;
        rope_2d(q, m, H, dh, 3 * C, im.grid_w);
        rope_2d(q + C, m, H, dh, 3 * C, im.grid_w);
        std::vector<float> s(static_cast<size_t>(m * m));  // [m, m] one head's scores
        for (int64_t h = 0; h < H; ++h) {
            ops::gemm(false,
                      true,
                      m,
                      m,
                      dh,
                      scale,
                      q + h * dh,
                      3 * C,
                      q + C + h * dh,
                      3 * C,
                      0.0f,
                      s.data(),
                      m);
            ops::softmax_rows(s.data(), m, m);
            ops::gemm(false,
                      false,
                      m,
                      dh,
                      m,
                      1.0f,
                      s.data(),
                      m,
                      q + 2 * C + h * dh,
                      3 * C,
                      0.0f,
                      o.ptr<float>() + off * C + h * dh,
                      C);
        }
        off += m;
    }
    linear_bias(o.view(), w.wo_w, w.wo_b, y.view());
    ops::add_inplace(x, y.view());
    Buffer f(DType::f32, {n, M});
    ops::layer_norm(x, w.norm1_w.view(), w.norm1_b.view(), kLnEps, xn.view());
    linear_bias(xn.view(), w.fc0_w, w.fc0_b, f.view());
    for (int64_t i = 0; i < n * M; ++i)
        f.ptr<float>()[i] = gelu_tanh(f.ptr<float>()[i]);
    linear_bias(f.view(), w.fc1_w, w.fc1_b, y.view());
    ops::add_inplace(x, y.view());
}

void vision_pool(const std::vector<VisionImage>& images, int pool, const Tensor& x, Tensor& out) {
    const int64_t C = x.dim(1);
    const float* in = x.ptr<float>();
    float* o = out.ptr<float>();
    const float inv = 1.0f / static_cast<float>(pool * pool);
    for (const VisionImage& im : images) {
        const int64_t h = im.grid_h / pool, w = im.grid_w / pool;
        for (int64_t r = 0; r < h; ++r)
            for (int64_t c = 0; c < w; ++c, o += C) {
                std::fill_n(o, C, 0.0f);
                for (int64_t dy = 0; dy < pool; ++dy)
                    for (int64_t dx = 0; dx < pool; ++dx) {
                        const float* e = in + ((r * pool + dy) * im.grid_w + c * pool + dx) * C;
                        for (int64_t k = 0; k < C; ++k)
                            o[k] += e[k];
                    }
                for (int64_t k = 0; k < C; ++k)
                    o[k] *= inv;
            }
        in += im.grid_h * im.grid_w * C;
    }
}

void patch_merge(
    const std::vector<VisionImage>& images, int pool, int merge, const Tensor& x, Tensor& out) {
    const int64_t C = x.dim(1), m = merge;
    const float* in = x.ptr<float>();
    float* o = out.ptr<float>();
    for (const VisionImage& im : images) {
        const int64_t h = im.grid_h / pool, w = im.grid_w / pool;
        for (int64_t r = 0; r < h / m; ++r)
            for (int64_t c = 0; c < w / m; ++c)
                for (int64_t ih = 0; ih < m; ++ih)
                    for (int64_t iw = 0; iw < m; ++iw, o += C)
                        std::copy_n(in + ((r * m + ih) * w + c * m + iw) * C, C, o);
        in += h * w * C;
    }
}

void vision_project(const VisionConfig& v,
                    const VisionWeights& w,
                    const Tensor& merged,
                    Tensor& out) {
    const int64_t n = merged.dim(0), C4 = merged.dim(1), C = v.width;
    Buffer normed(DType::f32, {n * C4 / C, C}), hid(DType::f32, {n, C4});
    Tensor slots = merged;  // [n·m², C]
    slots.shape = {n * C4 / C, C};
    ops::layer_norm(slots, w.proj_norm_w.view(), w.proj_norm_b.view(), kLnEps, normed.view());
    Tensor flat = normed.view();
    flat.shape = {n, C4};
    linear_bias(flat, w.linear_1_w, w.linear_1_b, hid.view());
    for (int64_t i = 0; i < n * C4; ++i)
        hid.ptr<float>()[i] = gelu_erf(hid.ptr<float>()[i]);
    linear_bias(hid.view(), w.linear_2_w, w.linear_2_b, out);
}

void vision_forward(const ModelConfig& cfg,
                    const VisionWeights& w,
                    const std::vector<VisionImage>& images,
                    int pool,
                    Tensor& out,
                    VisionStats* stats) {
    const VisionConfig& v = cfg.vision;
    const double t0 = wall_seconds(), f0 = ops::gemm_counter().flops;
    const int64_t C = v.width, p = v.patch_size, M = v.mlp, m2 = int64_t{v.merge} * v.merge;
    const int64_t tokens = checked_vision_tokens(v, images, pool);
    HYMOE_CHECK(out.dim(0) == tokens && out.dim(1) == cfg.hidden_size,
                "vision: out ",
                out.dim(0),
                "x",
                out.dim(1),
                " for ",
                tokens,
                " tokens");
    const int64_t n = total_patches(images), np = n / (int64_t{pool} * pool);
    Buffer patches(DType::f32, {n, 3 * p * p}), x(DType::f32, {n, C});
    patchify(v, images, patches.view());
    ops::linear(patches.view(), as_matrix(w.patch_w, C, 3 * p * p), x.view());
    int64_t off = 0;
    for (const VisionImage& im : images) {
        const int64_t m = im.grid_h * im.grid_w;
        Tensor rows = x.view().rows(off, m);
        for (int64_t r = 0; r < m; ++r)
            for (int64_t k = 0; k < C; ++k)
                rows.ptr<float>()[r * C + k] += w.patch_b.ptr<float>()[k];
        add_position_embedding(v, w, im.grid_h, im.grid_w, rows);
        off += m;
    }
    for (const VisionBlockWeights& b : w.blocks)
        vision_block(v, b, images, x.view());
    ops::layer_norm(x.view(), w.final_w.view(), w.final_b.view(), kLnEps, x.view());
    Buffer pooled(DType::f32, {np, C}), merged(DType::f32, {np / m2, m2 * C});
    vision_pool(images, pool, x.view(), pooled.view());
    patch_merge(images, pool, v.merge, pooled.view(), merged.view());
    vision_project(v, w, merged.view(), out);
    if (!stats)
        return;
    // activations alive at the widest point: patches, x, a block's xn/qkv/o/y/MLP and one
    // image's scores, then the pooled / merged copies and the projector's two buffers
    int64_t widest = 0;
    for (const VisionImage& im : images)
        widest = std::max(widest, im.grid_h * im.grid_w);
    const int64_t block = n * (C + 3 * C + C + C + M) + widest * widest;
    const int64_t floats = n * 3 * p * p + n * C + std::max(block, 2 * np * C + np * C + np * C);
    stats->images += static_cast<int64_t>(images.size());
    stats->patches += n;
    stats->tokens += tokens;
    stats->seconds += wall_seconds() - t0;
    stats->flops += ops::gemm_counter().flops - f0;
    stats->peak_act_bytes = std::max(stats->peak_act_bytes, floats * int64_t{sizeof(float)});
}

}  // namespace hymoe::model
