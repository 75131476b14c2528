// AdamW, the learning-rate schedule and the gradient norm (runtime/optimizer.h); the update
// itself is ops::adamw on the optimizer's Ctx.
#include "hymoe/runtime/optimizer.h"

#include <cmath>
#include <numbers>

#include "hymoe/backend/ops_backward.h"

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

AdamW::AdamW(const deck::OptimizerSection& o, model::TensorList params, model::TensorList grads)
    : o_(o), params_(std::move(params)), grads_(std::move(grads)) {
    for (const model::TensorSpec& p : params_) {
        m_.emplace_back(DType::f32, p.shape);
        v_.emplace_back(DType::f32, p.shape);
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
    for (size_t i = 0; i < params_.size(); ++i) {
        Tensor p = params_[i].dest->view(), m = m_[i].view(), v = v_[i].view();
        ops::adamw(ctx_, p, grads_[i].dest->view(), m, v, s);
    }
}

model::TensorList AdamW::state() {
    model::TensorList list;
    for (size_t i = 0; i < params_.size(); ++i) {
        model::TensorSpec m = params_[i], v = params_[i];
        m.name += ".exp_avg", m.dest = &m_[i];
        v.name += ".exp_avg_sq", v.dest = &v_[i];
        list.push_back(m);
        list.push_back(v);
    }
    return list;
}

}  // namespace hymoe::runtime
