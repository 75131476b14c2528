// The GPU model's vision encoder (device_vision.h): per pass, the host patchifies the images and
// looks up their position tables, the device embeds the patches, runs the ViT blocks, the final
// norm, pooling + merge (one gather of row means) and the projector, and the tokens come back.
#include "device_vision.h"

#include <algorithm>
#include <cmath>

#include "hymoe/backend/cuda_ops.h"
#include "hymoe/core/error.h"
#include "hymoe/core/timer.h"

namespace hymoe::model::gpu {

namespace {

constexpr float kLnEps = 1e-5f;  // every LayerNorm of the tower and projector (model/vision.cpp)
constexpr int64_t kPositionCacheBytes = int64_t{256} << 20;  // host position tables kept

}  // namespace

DeviceVision::DeviceVision(Gpu& g, const ModelConfig& cfg, const VisionWeights& host, DType cd)
    : g_(g),
      v_(cfg.vision),
      d_(cfg.hidden_size),
      cd_(cd),
      positions_(cfg.vision, host, kPositionCacheBytes) {
    const int64_t C = v_.width, p = v_.patch_size;
    HYMOE_CHECK(v_.n_head > 0 && C % v_.n_head == 0 && (C / v_.n_head) % 4 == 0 &&
                    C / v_.n_head <= 4 * backend::cuda::kMaxRope2dFreqs,
                "GPU vision tower: width ",
                C,
                " over ",
                v_.n_head,
                " heads (head width a multiple of 4, at most ",
                4 * backend::cuda::kMaxRope2dFreqs,
                ")");
    const DType f = DType::f32;
    patch_w_ = upload_weight(g, host.patch_w, {C, 3 * p * p}, cd);  // [C, 3, p, p] as a matrix
    patch_b_ = upload_weight(g, host.patch_b, f);
    for (const VisionBlockWeights& b : host.blocks) {
        VisionBlockW w;
        w.norm0_w = upload_weight(g, b.norm0_w, f);
        w.norm0_b = upload_weight(g, b.norm0_b, f);
        w.wqkv = upload_weight(g, b.wqkv_w, cd);
        w.wqkv_b = upload_weight(g, b.wqkv_b, f);
        w.wo = upload_weight(g, b.wo_w, cd);
        w.wo_b = upload_weight(g, b.wo_b, f);
        w.norm1_w = upload_weight(g, b.norm1_w, f);
        w.norm1_b = upload_weight(g, b.norm1_b, f);
        w.fc0 = upload_weight(g, b.fc0_w, cd);
        w.fc0_b = upload_weight(g, b.fc0_b, f);
        w.fc1 = upload_weight(g, b.fc1_w, cd);
        w.fc1_b = upload_weight(g, b.fc1_b, f);
        blocks_.push_back(w);
    }
    final_w_ = upload_weight(g, host.final_w, f);
    final_b_ = upload_weight(g, host.final_b, f);
    proj_norm_w_ = upload_weight(g, host.proj_norm_w, f);
    proj_norm_b_ = upload_weight(g, host.proj_norm_b, f);
    linear_1_ = upload_weight(g, host.linear_1_w, cd);
    linear_1_b_ = upload_weight(g, host.linear_1_b, f);
    linear_2_ = upload_weight(g, host.linear_2_w, cd);
    linear_2_b_ = upload_weight(g, host.linear_2_b, f);
}

int64_t DeviceVision::row_bytes() const {
    const int64_t C = v_.width, M = v_.mlp, pp = 3 * int64_t{v_.patch_size} * v_.patch_size;
    const int64_t cs = cd_ == DType::f32 ? 0 : 2;    // a cast copy's bytes an element (f32: none)
    const int64_t embed = 4 * pp + cs * pp + 4 * C;  // patches, cast, positions
    const int64_t block = 4 * (6 * C + M) + cs * (3 * C + M);   // xn qkv o y f, casts
    const int64_t project = 4 * (2 * C + d_) + 2 * cs * C + 8;  // merged, hidden, out, rows
    return 4 * C + 8 + std::max({embed, block, project});       // + x and the RoPE positions
}

void DeviceVision::linear(Scratch& s,
                          const Tensor& x,
                          const Tensor& w,
                          const Tensor& b,
                          backend::cuda::BiasAct act,
                          Tensor& y) {
    g_.blas.linear(in_dtype(g_, s, x, w.dtype), w, y);
    backend::cuda::bias_act(g_.stream, y, b, act);
    flops_ += 2.0 * static_cast<double>(y.dim(0)) * static_cast<double>(w.dim(0)) *
              static_cast<double>(w.dim(1));
}

void DeviceVision::attention(const std::vector<VisionImage>& images,
                             const Tensor& qkv,
                             Tensor& scores,
                             int64_t scores_bytes,
                             Tensor& o) {
    const int64_t C = v_.width, H = v_.n_head, dh = C / H;
    const float scale = 1.0f / std::sqrt(static_cast<float>(dh));
    int64_t off = 0;
    for (const VisionImage& im : images) {
        const int64_t m = im.grid_h * im.grid_w, at_once = vision_heads_at_once(m, H, scores_bytes);
        const float* q = qkv.ptr<float>() + off * 3 * C;  // [m, 3C] this image's q | k | v
        for (int64_t h0 = 0; h0 < H; h0 += at_once) {
            const int64_t hn = std::min(at_once, H - h0);
            for (int64_t i = 0; i < hn; ++i)  // scores [hn, m, m] = τ q_h k_hᵀ
                g_.blas.gemm(DType::f32,
                             DType::f32,
                             false,
                             true,
                             m,
                             m,
                             dh,
                             scale,
                             q + (h0 + i) * dh,
                             3 * C,
                             q + C + (h0 + i) * dh,
                             3 * C,
                             0.0f,
                             scores.ptr<float>() + i * m * m,
                             m);
            Tensor rows = scores;
            rows.shape = {hn * m, m};
            backend::cuda::softmax_rows(g_.stream, rows);
            for (int64_t i = 0; i < hn; ++i)  // o_h [m, dh] = P_h v_h
                g_.blas.gemm(DType::f32,
                             DType::f32,
                             false,
                             false,
                             m,
                             dh,
                             m,
                             1.0f,
                             scores.ptr<float>() + i * m * m,
                             m,
                             q + 2 * C + (h0 + i) * dh,
                             3 * C,
                             0.0f,
                             o.ptr<float>() + off * C + (h0 + i) * dh,
                             C);
        }
        flops_ += 4.0 * static_cast<double>(m) * static_cast<double>(m) *
                  static_cast<double>(C);  // two GEMMs of 2·m·m·dh a head
        off += m;
    }
}

void DeviceVision::block(const VisionBlockW& w,
                         const std::vector<VisionImage>& images,
                         const Tensor& rope_pos,
                         Tensor& scores,
                         int64_t scores_bytes,
                         Tensor& x) {
    namespace cu = backend::cuda;
    const cu::Stream& st = g_.stream;
    const int64_t n = x.dim(0), C = v_.width, H = v_.n_head, M = v_.mlp;
    Scratch s(g_.arena);
    Tensor xn = s(DType::f32, {n, C}), qkv = s(DType::f32, {n, 3 * C});
    Tensor o = s(DType::f32, {n, C}), y = s(DType::f32, {n, C}), f = s(DType::f32, {n, M});
    cu::layer_norm(st, x, w.norm0_w, w.norm0_b, kLnEps, xn);
    linear(s, xn, w.wqkv, w.wqkv_b, cu::BiasAct::none, qkv);  // [n, 3, H, dh]
    // q and k are 2H heads of dh side by side in each row
    cu::rope_2d(st, qkv.ptr<float>(), n, 2 * H, C / H, 3 * C, rope_pos.ptr<int32_t>());
    attention(images, qkv, scores, scores_bytes, o);
    linear(s, o, w.wo, w.wo_b, cu::BiasAct::none, y);
    cu::add_inplace(st, x, y);
    cu::layer_norm(st, x, w.norm1_w, w.norm1_b, kLnEps, xn);
    linear(s, xn, w.fc0, w.fc0_b, cu::BiasAct::gelu_tanh, f);
    linear(s, f, w.fc1, w.fc1_b, cu::BiasAct::none, y);
    cu::add_inplace(st, x, y);
}

int64_t DeviceVision::encode_pass(const std::vector<VisionImage>& images,
                                  int pool,
                                  int64_t scratch_bytes,
                                  float* out) {
    namespace cu = backend::cuda;
    const cu::Stream& st = g_.stream;
    const int64_t C = v_.width, pp = 3 * int64_t{v_.patch_size} * v_.patch_size;
    const int64_t m2 = int64_t{v_.merge} * v_.merge, g = int64_t{pool} * pool;
    const int64_t n = total_patches(images), np = n / g, tokens = np / m2;
    Scratch s(g_.arena);
    Tensor x = s(DType::f32, {n, C});
    // host tensors stay until the pass's last synchronisation
    Buffer patches(DType::f32, {n, pp}), positions(DType::f32, {n, C});
    patchify(v_, images, patches.view());
    int64_t row = 0;
    for (const VisionImage& im : images) {
        const std::vector<float>& table = positions_.get(im.grid_h, im.grid_w);  // [h·w, C]
        std::copy(table.begin(), table.end(), positions.ptr<float>() + row * C);
        row += im.grid_h * im.grid_w;
    }
    {  // x = patches · W_pᵀ + b_p + positions
        Scratch e(g_.arena);
        Tensor dev_patches = e(DType::f32, {n, pp}), dev_positions = e(DType::f32, {n, C});
        cu::upload(patches.view(), dev_patches, st);
        cu::upload(positions.view(), dev_positions, st);
        linear(e, dev_patches, patch_w_, patch_b_, cu::BiasAct::none, x);
        cu::add_inplace(st, x, dev_positions);
    }
    const std::vector<int32_t> where = patch_positions(images);
    const Tensor rope_pos = upload_values(g_, s, where, DType::i32);  // [n, 2]
    const int64_t scores_bytes = std::max<int64_t>(scratch_bytes - n * row_bytes(), 0);
    int64_t scores_floats = 0;
    for (const VisionImage& im : images) {
        const int64_t m = im.grid_h * im.grid_w;
        scores_floats =
            std::max(scores_floats, vision_heads_at_once(m, v_.n_head, scores_bytes) * m * m);
    }
    Tensor scores = s(DType::f32, {scores_floats});
    for (const VisionBlockW& w : blocks_)
        block(w, images, rope_pos, scores, scores_bytes, x);
    cu::layer_norm(st, x, final_w_, final_b_, kLnEps, x);
    // pooled and merged [np, C] = [tokens, m²C], then the projector
    const std::vector<int64_t> rows = pool_merge_rows(images, pool, v_.merge);
    Tensor idx = upload_values(g_, s, rows, DType::i64);
    idx.shape = {np, g};
    Tensor merged = s(DType::f32, {np, C}), hidden = s(DType::f32, {tokens, m2 * C});
    Tensor y = s(DType::f32, {tokens, d_});
    cu::gather_mean_rows(st, x, idx, merged);
    cu::layer_norm(st, merged, proj_norm_w_, proj_norm_b_, kLnEps, merged);  // per patch slot
    Tensor flat = merged;
    flat.shape = {tokens, m2 * C};
    linear(s, flat, linear_1_, linear_1_b_, cu::BiasAct::gelu_erf, hidden);
    linear(s, hidden, linear_2_, linear_2_b_, cu::BiasAct::none, y);
    Tensor host{out, DType::f32, Device::cpu, {tokens, d_}};
    cu::download(y, host, st);
    st.synchronize();
    return n * row_bytes() + scores_floats * 4;
}

void DeviceVision::encode(const std::vector<VisionImage>& images,
                          int pool,
                          int64_t scratch_bytes,
                          Tensor& out,
                          VisionStats* stats) {
    const double t0 = wall_seconds();
    const int64_t tokens = checked_vision_tokens(v_, images, pool);
    HYMOE_CHECK(out.device == Device::cpu && out.dtype == DType::f32 && out.shape.size() == 2 &&
                    out.dim(0) == tokens && out.dim(1) == d_,
                "GPU vision: out ",
                to_string(out.dtype),
                shape_string(out.shape),
                " for ",
                tokens,
                " tokens of width ",
                d_);
    flops_ = 0;
    int64_t row = 0, peak = 0;
    for (const VisionPass& p : vision_passes(images, row_bytes(), scratch_bytes)) {
        const auto first = images.begin() + static_cast<std::ptrdiff_t>(p.first);
        const std::vector<VisionImage> part(first, first + static_cast<std::ptrdiff_t>(p.count));
        peak = std::max(peak, encode_pass(part, pool, scratch_bytes, out.ptr<float>() + row * d_));
        row += checked_vision_tokens(v_, part, pool);
    }
    if (!stats)
        return;
    stats->images += static_cast<int64_t>(images.size());
    stats->patches += total_patches(images);
    stats->tokens += tokens;
    stats->seconds += wall_seconds() - t0;
    stats->flops += flops_;
    stats->peak_act_bytes = std::max(stats->peak_act_bytes, peak);
}

}  // namespace hymoe::model::gpu
