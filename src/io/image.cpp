// PNG / JPEG decoding, grid choice, resizing and normalisation of request images (io/image.h).
// libjpeg reports errors through a longjmp out of its error_exit hook: the only objects alive
// across the setjmp are plain ones created before it, released on both paths.
#include "hymoe/io/image.h"

#include <algorithm>
#include <cmath>
#include <csetjmp>
#include <cstdio>
#include <jpeglib.h>
#include <memory>
#include <png.h>

#include "hymoe/backend/resize.h"
#include "hymoe/core/error.h"

namespace hymoe::io {

namespace {

constexpr float kMean = 0.5f, kStd = 0.5f;  // MoonViT image_mean / image_std, every channel

[[noreturn]] void bad(const std::string& path, const std::string& why) {
    HYMOE_FAIL(Exit::bad_input, "image ", path, ": ", why);
}

void check_size(const std::string& path, int64_t h, int64_t w, int64_t max_pixels) {
    if (h <= 0 || w <= 0)
        bad(path, "empty image");
    if (h * w > max_pixels)
        bad(path,
            cat(w,
                "x",
                h,
                " pixels is oversized (more than ",
                max_pixels,
                " pixels, inference.images.max_pixels)"));
}

RawImage decode_png(const std::string& path, int64_t max_pixels) {
    png_image img{};
    img.version = PNG_IMAGE_VERSION;
    if (!png_image_begin_read_from_file(&img, path.c_str()))
        bad(path, cat("unreadable PNG (", img.message, ")"));
    const int64_t h = img.height, w = img.width;
    if (h * w > max_pixels || h <= 0 || w <= 0) {
        png_image_free(&img);
        check_size(path, h, w, max_pixels);
    }
    img.format = PNG_FORMAT_RGB;  // grey/palette expanded; alpha composed over black
    RawImage raw;
    raw.height = h, raw.width = w;
    raw.rgb.resize(static_cast<size_t>(h * w * 3));
    if (!png_image_finish_read(&img, nullptr, raw.rgb.data(), 0, nullptr)) {
        const std::string msg = img.message;
        png_image_free(&img);
        bad(path, "corrupt PNG (" + msg + ")");
    }
    return raw;
}

struct JpegError {
    jpeg_error_mgr mgr;
    std::jmp_buf jump;
    char message[JMSG_LENGTH_MAX];
};

void jpeg_fail(j_common_ptr info) {
    auto* err = reinterpret_cast<JpegError*>(info->err);
    info->err->format_message(info, err->message);
    std::longjmp(err->jump, 1);
}

RawImage decode_jpeg(const std::string& path, int64_t max_pixels) {
    std::FILE* f = std::fopen(path.c_str(), "rb");
    if (!f)
        bad(path, "cannot open the file");
    RawImage raw;
    jpeg_decompress_struct info{};
    JpegError err{};
    info.err = jpeg_std_error(&err.mgr);
    err.mgr.error_exit = jpeg_fail;
    bool oversized = false;
    if (setjmp(err.jump)) {
        jpeg_destroy_decompress(&info);
        std::fclose(f);
        bad(path, cat("corrupt JPEG (", err.message, ")"));
    }
    jpeg_create_decompress(&info);
    jpeg_stdio_src(&info, f);
    jpeg_read_header(&info, TRUE);
    info.out_color_space = JCS_RGB;  // grey and YCbCr converted by the library
    const int64_t h = info.image_height, w = info.image_width;
    oversized = h * w > max_pixels || h <= 0 || w <= 0;
    if (!oversized) {
        jpeg_start_decompress(&info);
        raw.height = h, raw.width = w;
        raw.rgb.resize(static_cast<size_t>(h * w * 3));
        while (info.output_scanline < info.output_height) {
            JSAMPROW row = raw.rgb.data() + static_cast<int64_t>(info.output_scanline) * w * 3;
            jpeg_read_scanlines(&info, &row, 1);
        }
        jpeg_finish_decompress(&info);
    }
    jpeg_destroy_decompress(&info);
    std::fclose(f);
    if (oversized)
        check_size(path, h, w, max_pixels);
    return raw;
}

}  // namespace

RawImage decode_image(const std::string& path, int64_t max_pixels) {
    unsigned char magic[8] = {};
    {
        std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "rb"),
                                                          &std::fclose);
        if (!f)
            bad(path, "cannot open the file");
        if (std::fread(magic, 1, sizeof magic, f.get()) != sizeof magic)
            bad(path, "too short for a PNG or JPEG file");
    }
    if (png_sig_cmp(magic, 0, 8) == 0)
        return decode_png(path, max_pixels);
    if (magic[0] == 0xFF && magic[1] == 0xD8 && magic[2] == 0xFF)
        return decode_jpeg(path, max_pixels);
    bad(path, "not a PNG or JPEG file");
}

void image_grid(int64_t height, int64_t width, const ImageOptions& o, int64_t& gh, int64_t& gw) {
    const double ph = static_cast<double>(height) / o.patch,
                 pw = static_cast<double>(width) / o.patch;
    const double n = std::floor(ph) * std::floor(pw);
    const double s = n > static_cast<double>(o.max_patches) ? std::sqrt(o.max_patches / n) : 1.0;
    auto side = [&](double patches) {
        return std::max<int64_t>(1, std::llround(patches * s / o.unit)) * o.unit;
    };
    gh = side(ph), gw = side(pw);
}

Image preprocess_image(const RawImage& raw, const ImageOptions& o) {
    Image img;
    image_grid(raw.height, raw.width, o, img.grid_h, img.grid_w);
    const int64_t H = img.grid_h * o.patch, W = img.grid_w * o.patch;
    std::vector<float> src(raw.rgb.begin(), raw.rgb.end());  // [h, w, 3]
    std::vector<float> dst(static_cast<size_t>(H * W * 3));  // [H, W, 3]
    ops::resize_bicubic(src.data(), raw.height, raw.width, 3, dst.data(), H, W);
    img.pixels.resize(dst.size());
    for (int64_t i = 0; i < H * W; ++i)
        for (int64_t c = 0; c < 3; ++c) {
            const float v = std::clamp(dst[i * 3 + c], 0.0f, 255.0f) / 255.0f;
            img.pixels[c * H * W + i] = (v - kMean) / kStd;
        }
    return img;
}

Image load_image(const std::string& path, const ImageOptions& o) {
    return preprocess_image(decode_image(path, o.max_pixels), o);
}

}  // namespace hymoe::io
