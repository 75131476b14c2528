// Named weight tensors (hymoe/model/weights.h): allocation at each tensor's storage dtype and
// the two ways to fill a list, random init by rule (drawing from one Philox stream in list order)
// and reading by name.
#include "hymoe/model/weights.h"

#include <algorithm>
#include <cmath>

#include "hymoe/core/error.h"

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

bool stored_matrix(const TensorSpec& spec) {
    return spec.shape.size() == 2 && spec.init == Init::normal && !spec.keep_f32;
}

TensorList in_block(WeightBlock b, TensorList list) {
    for (TensorSpec& spec : list)
        spec.block = b;
    return list;
}

TensorList with_storage(TensorList list, DType storage) {
    for (TensorSpec& spec : list)
        spec.dtype = stored_matrix(spec) ? storage : DType::f32;
    return list;
}

void store_floats(const float* x, int64_t n, DType t, void* dst) {
    if (t == DType::f32) {
        std::copy_n(x, n, static_cast<float*>(dst));
        return;
    }
    auto* out = static_cast<uint16_t*>(dst);
    for (int64_t i = 0; i < n; ++i)
        out[i] = t == DType::bf16 ? float_to_bf16(x[i]) : float_to_f16(x[i]);
}

void load_floats(const void* src, int64_t n, DType t, float* x) {
    if (t == DType::f32) {
        std::copy_n(static_cast<const float*>(src), n, x);
        return;
    }
    const auto* in = static_cast<const uint16_t*>(src);
    for (int64_t i = 0; i < n; ++i)
        x[i] = t == DType::bf16 ? bf16_to_float(in[i]) : f16_to_float(in[i]);
}

std::vector<float> widened(const Tensor& w) {
    std::vector<float> x(static_cast<size_t>(w.numel()));
    load_floats(w.data, w.numel(), w.dtype, x.data());
    return x;
}

void init_random(const TensorList& list, Philox& rng) {
    constexpr size_t chunk = size_t{1} << 16;  // even: fill_normal in chunks is one call's stream
    for (const TensorSpec& spec : list) {
        *spec.dest = Buffer(spec.dtype, spec.shape);
        const auto n = static_cast<size_t>(spec.dest->view().numel());
        if (spec.dtype == DType::f32) {
            fill(spec.init, spec.std, spec.dest->ptr<float>(), n, rng);
            continue;
        }
        // a stored matrix (Init::normal): drawn in fp32 a chunk at a time, rounded into place,
        // so no fp32 copy of the tensor is ever held
        HYMOE_CHECK(
            spec.init == Init::normal, spec.name, ": only Init::normal is stored in 16 bits");
        std::vector<float> drawn(std::min(n, chunk));
        auto* dst = static_cast<char*>(spec.dest->view().data);
        for (size_t i = 0; i < n; i += chunk) {
            const size_t m = std::min(chunk, n - i);
            fill(spec.init, spec.std, drawn.data(), m, rng);
            store_floats(drawn.data(),
                         static_cast<int64_t>(m),
                         spec.dtype,
                         dst + i * dtype_size(spec.dtype));
        }
    }
}

void load_named(const TensorList& list,
                const std::string& prefix,
                const std::function<void(const std::string& name, Tensor& dest)>& read) {
    for (const TensorSpec& spec : list) {
        *spec.dest = Buffer(spec.dtype, spec.shape);
        read(prefix + spec.name, spec.dest->view());
    }
}

}  // namespace hymoe::model
