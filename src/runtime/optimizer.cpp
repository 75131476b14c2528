// AdamW, the learning-rate schedule and the gradient norm (runtime/optimizer.h); the update
// itself is ops::adamw on the optimizer's Ctx.
#include "hymoe/runtime/optimizer.h"

#include <cmath>
#include <numbers>

#include "hymoe/backend/ops_attention.h"
#include "hymoe/backend/ops_backward.h"
#include "hymoe/backend/ops_bulk.h"
#include "hymoe/core/error.h"

namespace hymoe::runtime {

double learning_rate(const deck::OptimizerSection& o, int64_t step, int64_t total) {
    if (o.warmup_steps > 0 && step < o.warmup_steps)
        return o.lr * static_cast<double>(step + 1) / o.warmup_steps;
    if (o.scheduler == "constant")
        return o.lr;
    const double span = std::max<int64_t>(total - o.warmup_steps, 1);
    const double progress = std::min(1.0, static_cast<double>(step - o.warmup_steps) / span);
    const double decay = o.scheduler == "cosine"
                             ? 0.5 * (1.0 + std::cos(std::numbers::pi * progress))
                             : 1.0 - progress;
    return o.lr * (o.min_lr_ratio + (1.0 - o.min_lr_ratio) * decay);
}

AdamW::AdamW(const deck::OptimizerSection& o,
             const backend::Ctx& ctx,
             model::TensorList names,
             std::vector<Tensor> params,
             std::vector<Tensor> grads)
    : o_(o),
      ctx_(ctx),
      names_(std::move(names)),
      params_(std::move(params)),
      grads_(std::move(grads)) {
    HYMOE_CHECK(names_.size() == params_.size() && params_.size() == grads_.size(),
                "AdamW: ",
                names_.size(),
                " names, ",
                params_.size(),
                " parameters, ",
                grads_.size(),
                " gradients");
    for (const model::TensorSpec& p : names_) {
        Buffer& m = m_.emplace_back(DType::f32, p.shape);
        Buffer& v = v_.emplace_back(DType::f32, p.shape);
        if (on_host()) {
            moments_m_.push_back(m.view());
            moments_v_.push_back(v.view());
            continue;
        }
        moments_m_.push_back(dm_.emplace_back(ctx_, DType::f32, p.shape).view());
        moments_v_.push_back(dv_.emplace_back(ctx_, DType::f32, p.shape).view());
    }
}

void AdamW::step(double lr, double grad_scale, int64_t t) {
    ops::AdamWStep s;
    s.lr = lr;
    s.beta1 = o_.beta1;
    s.beta2 = o_.beta2;
    s.eps = o_.eps;
    s.weight_decay = o_.weight_decay;
    s.c1 = 1.0 - std::pow(o_.beta1, static_cast<double>(t));
    s.c2 = 1.0 - std::pow(o_.beta2, static_cast<double>(t));
    s.grad_scale = grad_scale;
    for (size_t i = 0; i < params_.size(); ++i)
        ops::adamw(ctx_, params_[i], grads_[i], moments_m_[i], moments_v_[i], s);
}

model::TensorList AdamW::state() {
    model::TensorList list;
    for (size_t i = 0; i < names_.size(); ++i) {
        model::TensorSpec m = names_[i], v = names_[i];
        m.name += ".exp_avg", m.dest = &m_[i];
        v.name += ".exp_avg_sq", v.dest = &v_[i];
        list.push_back(m);
        list.push_back(v);
    }
    return list;
}

void AdamW::download_state() {
    if (on_host())
        return;
    std::vector<Tensor> src, dst;  // m then v of each parameter
    for (size_t i = 0; i < m_.size(); ++i) {
        src.insert(src.end(), {moments_m_[i], moments_v_[i]});
        dst.insert(dst.end(), {m_[i].view(), v_[i].view()});
    }
    ops::download_all(ctx_, src, dst);
}

void AdamW::upload_state() {
    if (on_host())
        return;
    for (size_t i = 0; i < m_.size(); ++i) {
        ops::upload(ctx_, m_[i].view(), moments_m_[i]);
        ops::upload(ctx_, v_[i].view(), moments_v_[i]);
    }
}

}  // namespace hymoe::runtime
