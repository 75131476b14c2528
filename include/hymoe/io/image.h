// Image input for the vision path (model-math §8): PNG and JPEG decoded with Debian's libpng and
// libjpeg(-turbo), converted to 8-bit RGB (grey and palette images expanded, alpha dropped),
// resized to a patch grid with the aspect ratio kept, and normalised with the MoonViT processor's
// mean and std (0.5, 0.5, 0.5 per channel: x = (v/255 − 0.5)/0.5, so pixels lie in [−1, 1]).
// Grid rule (Kimi-VL's MoonViTImageProcessor, with our rounding): an image of H×W pixels has
// (H/p)·(W/p) patches; when that is above max_patches it is scaled by s = sqrt(max_patches /
// ((H/p)(W/p))), else s = 1; each side then becomes the nearest multiple of `unit` patches (unit =
// merge·pool, at least one unit), so the grid is (gh, gw) patches and the image is resized to
// (gh·p) × (gw·p) pixels by torch-style bicubic interpolation (backend/resize.h), values clamped
// to [0, 255] before normalising. Rounding to the unit may put the grid slightly above
// max_patches. An unreadable file, a format other than PNG/JPEG, a corrupt stream or an image
// above max_pixels is an Exit::bad_input error naming the file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace hymoe::io {

struct ImageOptions {
    int patch = 14;                  // p: pixels per patch side
    int unit = 2;                    // grid sides are multiples of this many patches
    int64_t max_patches = 4096;      // patches per image before rounding (in_token_limit)
    int64_t max_pixels = 1ll << 26;  // decoded H·W above this: rejected as oversized
};

struct RawImage {
    int64_t height = 0, width = 0;
    std::vector<uint8_t> rgb;  // [height, width, 3]
};

struct Image {
    int64_t grid_h = 0, grid_w = 0;  // patches
    std::vector<float> pixels;       // [3, grid_h·p, grid_w·p] normalised, channel planes
};

// Decodes a PNG or JPEG file (chosen by its first bytes).
RawImage decode_image(const std::string& path, int64_t max_pixels);
// The patch grid (gh, gw) of an image of height × width pixels under the grid rule above.
void image_grid(int64_t height, int64_t width, const ImageOptions& o, int64_t& gh, int64_t& gw);
// Resize to the grid and normalise.
Image preprocess_image(const RawImage& raw, const ImageOptions& o);
// decode_image + preprocess_image.
Image load_image(const std::string& path, const ImageOptions& o);

}  // namespace hymoe::io
