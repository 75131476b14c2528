// Bicubic resampling with torch's align_corners=False conventions (see backend/resize.h).
#include "hymoe/backend/resize.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "hymoe/core/error.h"

namespace hymoe::ops {

namespace {

// The four tap indices (clamped to [0, in)) and weights of output index o along one axis.
struct Taps {
    int64_t idx[4];
    float w[4];
};

Taps cubic_taps(int64_t o, int64_t in, int64_t out) {
    constexpr float A = -0.75f;
    const float scale = static_cast<float>(in) / static_cast<float>(out);
    const float real = scale * (static_cast<float>(o) + 0.5f) - 0.5f;
    const float base = std::floor(real);
    const float t = real - base;
    // torch's cubic_convolution1 (|x| ≤ 1) and cubic_convolution2 (1 < |x| < 2)
    auto near = [](float x) { return ((A + 2) * x - (A + 3)) * x * x + 1; };
    auto far = [](float x) { return ((A * x - 5 * A) * x + 8 * A) * x - 4 * A; };
    Taps taps;
    taps.w[0] = far(t + 1), taps.w[1] = near(t), taps.w[2] = near(1 - t), taps.w[3] = far(2 - t);
    for (int k = 0; k < 4; ++k)
        taps.idx[k] = std::clamp<int64_t>(static_cast<int64_t>(base) - 1 + k, 0, in - 1);
    return taps;
}

}  // namespace

void resize_bicubic(const float* src,
                    int64_t in_h,
                    int64_t in_w,
                    int64_t c,
                    float* dst,
                    int64_t out_h,
                    int64_t out_w) {
    HYMOE_CHECK(in_h > 0 && in_w > 0 && out_h > 0 && out_w > 0 && c > 0,
                "resize_bicubic: ",
                in_h,
                "x",
                in_w,
                " -> ",
                out_h,
                "x",
                out_w,
                " x ",
                c);
    std::vector<Taps> xs(static_cast<size_t>(out_w));
    for (int64_t x = 0; x < out_w; ++x)
        xs[x] = cubic_taps(x, in_w, out_w);
    std::vector<float> row(static_cast<size_t>(in_w * c));  // [in_w, c] one vertically mixed row
    for (int64_t y = 0; y < out_h; ++y) {
        const Taps ty = cubic_taps(y, in_h, out_h);
        std::fill(row.begin(), row.end(), 0.0f);
        for (int k = 0; k < 4; ++k) {
            const float* s = src + ty.idx[k] * in_w * c;
            for (int64_t i = 0; i < in_w * c; ++i)
                row[i] += ty.w[k] * s[i];
        }
        for (int64_t x = 0; x < out_w; ++x) {
            float* d = dst + (y * out_w + x) * c;
            std::fill_n(d, c, 0.0f);
            for (int k = 0; k < 4; ++k) {
                const float* r = row.data() + xs[x].idx[k] * c;
                for (int64_t ch = 0; ch < c; ++ch)
                    d[ch] += xs[x].w[k] * r[ch];
            }
        }
    }
}

}  // namespace hymoe::ops
