// Reading and writing one column of a token row of a host latent cache view
// (backend/latent_cache.h), widened to fp32 or narrowed from it as model::KvPool does.
#include "hymoe/backend/latent_cache.h"

#include <algorithm>
#include <cstring>

#include "hymoe/core/types.h"

namespace hymoe::backend {

void latent_read(const LatentCache& c, int64_t b, int64_t u, LatentCol col, float* out) {
    const int64_t n = latent_col_width(c, col);
    const void* p = latent_at(c, b, u, col);
    if (c.dtype == DType::f32) {
        std::memcpy(out, p, static_cast<size_t>(n) * 4);
        return;
    }
    const auto* h = static_cast<const uint16_t*>(p);
    if (c.dtype == DType::bf16)
        for (int64_t i = 0; i < n; ++i)
            out[i] = bf16_to_float(h[i]);
    else
        for (int64_t i = 0; i < n; ++i)
            out[i] = f16_to_float(h[i]);
}

void latent_write(const LatentCache& c, int64_t b, int64_t u, LatentCol col, const float* in) {
    const int64_t n = latent_col_width(c, col);
    void* p = latent_at(c, b, u, col);
    if (c.dtype == DType::f32) {
        std::memcpy(p, in, static_cast<size_t>(n) * 4);
        return;
    }
    auto* h = static_cast<uint16_t*>(p);
    if (c.dtype == DType::bf16)
        for (int64_t i = 0; i < n; ++i)
            h[i] = float_to_bf16(in[i]);
    else
        for (int64_t i = 0; i < n; ++i)
            h[i] = float_to_f16(in[i]);
}

}  // namespace hymoe::backend
