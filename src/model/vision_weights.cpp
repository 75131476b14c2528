// The vision tower's one list of tensors (model/vision.h vision_tensors) and the views built by
// walking it (model/vision_views.h): a visitor names every tensor once, in load order, with its
// shape, init rule and slot in a VisionParts of any element type, so the host Buffers, their views
// and the GPU's copies are bound by the same walk.
#include <string>
#include <type_traits>

#include "hymoe/core/error.h"
#include "hymoe/model/vision.h"
#include "hymoe/model/vision_views.h"

namespace hymoe::model {

namespace {

// f(name, shape, init, slot) for every tensor of one block, in list order; k (a VisionBlockParts,
// const or not) null: slot null.
template <class K, class F>
void visit_block(const VisionConfig& v, const std::string& q, K* k, F&& f) {
    const int64_t C = v.width, M = v.mlp;
    using B = std::remove_const_t<K>;
    auto at = [&](auto B::*member) { return k ? &(k->*member) : nullptr; };
    f(q + "norm0.weight", Shape{C}, Init::ones, at(&B::norm0_w));
    f(q + "norm0.bias", Shape{C}, Init::zeros, at(&B::norm0_b));
    f(q + "wqkv.weight", Shape{3 * C, C}, Init::normal, at(&B::wqkv_w));
    f(q + "wqkv.bias", Shape{3 * C}, Init::zeros, at(&B::wqkv_b));
    f(q + "wo.weight", Shape{C, C}, Init::normal, at(&B::wo_w));
    f(q + "wo.bias", Shape{C}, Init::zeros, at(&B::wo_b));
    f(q + "norm1.weight", Shape{C}, Init::ones, at(&B::norm1_w));
    f(q + "norm1.bias", Shape{C}, Init::zeros, at(&B::norm1_b));
    f(q + "mlp.fc0.weight", Shape{M, C}, Init::normal, at(&B::fc0_w));
    f(q + "mlp.fc0.bias", Shape{M}, Init::zeros, at(&B::fc0_b));
    f(q + "mlp.fc1.weight", Shape{C, M}, Init::normal, at(&B::fc1_w));
    f(q + "mlp.fc1.bias", Shape{C}, Init::zeros, at(&B::fc1_b));
}

// The same over the whole tower and projector; w (a VisionParts, const or not, its blocks already
// n_layer long) null: slots null.
template <class W, class F>
void visit(const ModelConfig& cfg, W* w, F&& f) {
    const VisionConfig& v = cfg.vision;
    const int64_t C = v.width, p = v.patch_size, S = v.pos_emb_size;
    const int64_t C4 = int64_t{v.merge} * v.merge * C, d = cfg.hidden_size;
    const std::string t = "vision_tower.", pr = "multi_modal_projector.";
    using P = std::remove_const_t<W>;
    auto at = [&](auto P::*member) { return w ? &(w->*member) : nullptr; };
    f(t + "patch_embed.proj.weight", Shape{C, 3, p, p}, Init::normal, at(&P::patch_w));
    f(t + "patch_embed.proj.bias", Shape{C}, Init::zeros, at(&P::patch_b));
    f(t + "patch_embed.pos_emb.weight", Shape{S, S, C}, Init::normal, at(&P::pos_emb));
    for (int i = 0; i < v.n_layer; ++i)
        visit_block(v,
                    t + "encoder.blocks." + std::to_string(i) + ".",
                    w ? &w->blocks[static_cast<size_t>(i)] : nullptr,
                    f);
    f(t + "encoder.final_layernorm.weight", Shape{C}, Init::ones, at(&P::final_w));
    f(t + "encoder.final_layernorm.bias", Shape{C}, Init::zeros, at(&P::final_b));
    f(pr + "pre_norm.weight", Shape{C}, Init::ones, at(&P::proj_norm_w));
    f(pr + "pre_norm.bias", Shape{C}, Init::zeros, at(&P::proj_norm_b));
    f(pr + "linear_1.weight", Shape{C4, C4}, Init::normal, at(&P::linear_1_w));
    f(pr + "linear_1.bias", Shape{C4}, Init::zeros, at(&P::linear_1_b));
    f(pr + "linear_2.weight", Shape{d, C4}, Init::normal, at(&P::linear_2_w));
    f(pr + "linear_2.bias", Shape{d}, Init::zeros, at(&P::linear_2_b));
}

}  // namespace

TensorList vision_tensors(const ModelConfig& cfg, VisionWeights* w) {
    if (w)
        w->blocks.resize(static_cast<size_t>(cfg.vision.n_layer));
    TensorList list;
    visit(cfg, w, [&](std::string name, Shape shape, Init init, Buffer* dest) {
        list.push_back({std::move(name), std::move(shape), dest, init});
    });
    return in_block(WeightBlock::vision, std::move(list));
}

VisionWeightViews vision_views(const ModelConfig& cfg, const std::vector<Tensor>& tensors) {
    VisionWeightViews views;
    views.blocks.resize(static_cast<size_t>(cfg.vision.n_layer));
    size_t i = 0;
    visit(cfg, &views, [&](const std::string& name, const Shape& shape, Init, Tensor* slot) {
        HYMOE_CHECK(i < tensors.size(), "vision: ", tensors.size(), " tensors, ", name, " missing");
        *slot = tensors[i++];
        HYMOE_CHECK(slot->data == nullptr || slot->numel() == shape_numel(shape),
                    "vision: ",
                    name,
                    " of ",
                    shape_string(slot->shape),
                    " where ",
                    shape_string(shape),
                    " was expected");
    });
    HYMOE_CHECK(i == tensors.size(), "vision: ", tensors.size(), " tensors for a list of ", i);
    return views;
}

std::vector<const Buffer*> vision_list(const ModelConfig& cfg, const VisionWeights& host) {
    HYMOE_CHECK(static_cast<int>(host.blocks.size()) == cfg.vision.n_layer,
                "vision: ",
                host.blocks.size(),
                " blocks for a tower of ",
                cfg.vision.n_layer);
    std::vector<const Buffer*> list;
    visit(cfg, &host, [&](const std::string&, const Shape&, Init, const Buffer* b) {
        list.push_back(b);
    });
    return list;
}

VisionWeightViews vision_views(const ModelConfig& cfg, const VisionWeights& host) {
    std::vector<Tensor> views;
    for (const Buffer* b : vision_list(cfg, host))
        views.push_back(b->view());
    return vision_views(cfg, views);
}

VisionWeightViews vision_views(
    const ModelConfig& cfg,
    const VisionWeights& host,
    const std::function<Tensor(const TensorSpec& spec, const Buffer& buffer)>& f) {
    const TensorList specs = vision_tensors(cfg, nullptr);
    const std::vector<const Buffer*> list = vision_list(cfg, host);
    std::vector<Tensor> mapped;
    for (size_t i = 0; i < list.size(); ++i)
        mapped.push_back(f(specs[i], *list[i]));
    return vision_views(cfg, mapped);
}

VisionBlockViews vision_block_views(const VisionConfig& v, const VisionBlockWeights& host) {
    std::vector<Tensor> list;
    visit_block(v, "", &host, [&](const std::string&, const Shape&, Init, const Buffer* b) {
        list.push_back(b->view());
    });
    VisionBlockViews views;
    size_t i = 0;
    visit_block(v, "", &views, [&](const std::string&, const Shape&, Init, Tensor* slot) {
        *slot = list[i++];
    });
    return views;
}

}  // namespace hymoe::model
