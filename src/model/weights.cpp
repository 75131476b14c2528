// Named weight tensors (hymoe/model/weights.h): allocation in fp32 and the two ways to fill a
// list, random init by rule (drawing from one Philox stream in list order) and reading by name.
#include "hymoe/model/weights.h"

#include <algorithm>
#include <cmath>

namespace hymoe::model {

namespace {

// Fill x [n] by `init`, advancing rng (fla / HF initialisations, see Init).
void fill(Init init, float std, float* x, size_t n, Philox& rng) {
    switch (init) {
        case Init::normal:
            return rng.fill_normal(x, n, 0.0f, std);
        case Init::ones:
            return std::fill(x, x + n, 1.0f);
        case Init::zeros:
            return;  // Buffer is zero-filled
        case Init::kda_a_log:
            rng.fill_uniform(x, n, 1.0f, 16.0f);
            for (size_t i = 0; i < n; ++i)
                x[i] = std::log(x[i]);
            return;
        case Init::kda_dt_bias:
            // dt = exp(U(log 1e-3, log 1e-1)) ≥ 1e-4; bias = softplus⁻¹(dt) = dt + log(−expm1(−dt))
            rng.fill_uniform(x, n, std::log(1e-3f), std::log(1e-1f));
            for (size_t i = 0; i < n; ++i) {
                const float dt = std::max(std::exp(x[i]), 1e-4f);
                x[i] = dt + std::log(-std::expm1(-dt));
            }
            return;
        case Init::small_bias:
            return rng.fill_normal(x, n, 0.0f, 0.1f);
        case Init::uniform:
            return rng.fill_uniform(x, n, -std, std);
    }
}

}  // namespace

void init_random(const TensorList& list, Philox& rng) {
    for (const TensorSpec& spec : list) {
        *spec.dest = Buffer(DType::f32, spec.shape);
        fill(spec.init,
             spec.std,
             spec.dest->ptr<float>(),
             static_cast<size_t>(spec.dest->view().numel()),
             rng);
    }
}

void load_named(const TensorList& list,
                const std::string& prefix,
                const std::function<void(const std::string& name, Tensor& dest)>& read) {
    for (const TensorSpec& spec : list) {
        *spec.dest = Buffer(DType::f32, spec.shape);
        read(prefix + spec.name, spec.dest->view());
    }
}

}  // namespace hymoe::model
