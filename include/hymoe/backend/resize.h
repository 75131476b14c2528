// Bicubic resampling of channel-last images (host fp32), with torch's conventions
// (F.interpolate(mode="bicubic", align_corners=False), no antialias): the source coordinate of
// output index o is (o + 0.5)·in/out − 0.5, the cubic kernel has A = −0.75, and taps outside the
// image read the nearest edge pixel. Resizing to the same size copies exactly. Used for the
// MoonViT position table (model-math §8: interpolated to each image's grid) and for resizing
// decoded images to their patch grid.
#pragma once

#include <cstdint>

namespace hymoe::ops {

// dst [out_h, out_w, c] = bicubic(src [in_h, in_w, c]); dst may not alias src.
void resize_bicubic(const float* src,
                    int64_t in_h,
                    int64_t in_w,
                    int64_t c,
                    float* dst,
                    int64_t out_h,
                    int64_t out_w);

}  // namespace hymoe::ops
