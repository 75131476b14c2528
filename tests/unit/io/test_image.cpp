// Unit tests of image input (hymoe/io/image.h): a PNG and a JPEG written here with libpng and
// libjpeg decode to their pixels (PNG exactly, JPEG at quality 100 within a few levels); grey and
// RGBA PNGs become RGB; the grid rule (aspect kept, rounding to the unit, scaling down to
// max_patches); normalisation to [−1, 1]; and the Exit::bad_input errors for a missing file, a
// file that is no image, a truncated PNG and an oversized image.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <jpeglib.h>
#include <png.h>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "hymoe/core/error.h"
#include "hymoe/io/image.h"

namespace fs = std::filesystem;
using namespace hymoe;

namespace {

std::string tmp(const std::string& name) {
    return (fs::temp_directory_path() / ("hymoe_test_image_" + name)).string();
}

// [h, w, 3] test pattern
std::vector<uint8_t> pattern(int h, int w) {
    std::vector<uint8_t> px(static_cast<size_t>(h * w * 3));
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x) {
            uint8_t* p = px.data() + (y * w + x) * 3;
            p[0] = static_cast<uint8_t>(8 * x), p[1] = static_cast<uint8_t>(8 * y);
            p[2] = static_cast<uint8_t>(128 + 4 * (x - y));
        }
    return px;
}

void write_png(const std::string& path, const std::vector<uint8_t>& px, int h, int w, int format) {
    png_image img{};
    img.version = PNG_IMAGE_VERSION;
    img.width = static_cast<png_uint_32>(w);
    img.height = static_cast<png_uint_32>(h);
    img.format = static_cast<png_uint_32>(format);
    BOOST_REQUIRE(png_image_write_to_file(&img, path.c_str(), 0, px.data(), 0, nullptr));
}

void write_jpeg(const std::string& path, const std::vector<uint8_t>& px, int h, int w) {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    BOOST_REQUIRE(f);
    jpeg_compress_struct info{};
    jpeg_error_mgr err{};
    info.err = jpeg_std_error(&err);
    jpeg_create_compress(&info);
    jpeg_stdio_dest(&info, f);
    info.image_width = static_cast<JDIMENSION>(w);
    info.image_height = static_cast<JDIMENSION>(h);
    info.input_components = 3;
    info.in_color_space = JCS_RGB;
    jpeg_set_defaults(&info);
    jpeg_set_quality(&info, 100, TRUE);
    jpeg_start_compress(&info, TRUE);
    while (info.next_scanline < info.image_height) {
        JSAMPROW row = const_cast<uint8_t*>(px.data()) + info.next_scanline * w * 3;
        jpeg_write_scanlines(&info, &row, 1);
    }
    jpeg_finish_compress(&info);
    jpeg_destroy_compress(&info);
    std::fclose(f);
}

bool bad_input(const Error& e) {
    return e.code() == Exit::bad_input;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(image)

BOOST_AUTO_TEST_CASE(png_decodes_exactly) {
    const int h = 12, w = 20;
    const std::vector<uint8_t> px = pattern(h, w);
    const std::string path = tmp("rgb.png");
    write_png(path, px, h, w, PNG_FORMAT_RGB);
    const io::RawImage raw = io::decode_image(path, 1 << 20);
    BOOST_TEST(raw.height == h);
    BOOST_TEST(raw.width == w);
    BOOST_TEST(raw.rgb == px, boost::test_tools::per_element());
    fs::remove(path);
}

BOOST_AUTO_TEST_CASE(grey_and_rgba_png_become_rgb) {
    const int h = 4, w = 5;
    std::vector<uint8_t> grey(h * w), rgba(h * w * 4);
    for (int i = 0; i < h * w; ++i) {
        grey[i] = static_cast<uint8_t>(10 * i);
        rgba[4 * i] = 200, rgba[4 * i + 1] = 100, rgba[4 * i + 2] = 50, rgba[4 * i + 3] = 255;
    }
    const std::string g = tmp("grey.png"), a = tmp("rgba.png");
    write_png(g, grey, h, w, PNG_FORMAT_GRAY);
    write_png(a, rgba, h, w, PNG_FORMAT_RGBA);
    const io::RawImage rg = io::decode_image(g, 1 << 20), ra = io::decode_image(a, 1 << 20);
    BOOST_TEST(rg.rgb.size() == static_cast<size_t>(h * w * 3));
    // libpng converts grey through sRGB-linear; the grey levels stay equal across channels
    for (int i = 0; i < h * w; ++i) {
        BOOST_TEST(rg.rgb[3 * i] == rg.rgb[3 * i + 1]);
        BOOST_TEST(rg.rgb[3 * i] == rg.rgb[3 * i + 2]);
    }
    BOOST_TEST(ra.rgb[0] == 200);
    BOOST_TEST(ra.rgb[1] == 100);
    BOOST_TEST(ra.rgb[2] == 50);
    fs::remove(g);
    fs::remove(a);
}

BOOST_AUTO_TEST_CASE(jpeg_decodes_within_a_few_levels) {
    const int h = 16, w = 24;
    const std::vector<uint8_t> px = pattern(h, w);
    const std::string path = tmp("rgb.jpg");
    write_jpeg(path, px, h, w);
    const io::RawImage raw = io::decode_image(path, 1 << 20);
    BOOST_TEST(raw.height == h);
    BOOST_TEST(raw.width == w);
    int worst = 0;
    for (size_t i = 0; i < px.size(); ++i)
        worst = std::max(worst, std::abs(int{raw.rgb[i]} - int{px[i]}));
    BOOST_TEST(worst <= 6);
    fs::remove(path);
}

// 16×24 px at p 4, unit 2: 4×6 patches as is; 40×30 px at max 16 patches: 10 × 7.5 patches
// (whole patches 10·7 = 70 > 16), s = sqrt(16/70), sides 10s = 4.78 and 7.5s = 3.59 patches,
// both rounded to 2 units = 4 patches.
BOOST_AUTO_TEST_CASE(grid_keeps_the_aspect_and_rounds_to_the_unit) {
    io::ImageOptions o;
    o.patch = 4, o.unit = 2, o.max_patches = 4096;
    int64_t gh = 0, gw = 0;
    io::image_grid(16, 24, o, gh, gw);
    BOOST_TEST(gh == 4);
    BOOST_TEST(gw == 6);
    io::image_grid(3, 3, o, gh, gw);  // tiny: at least one unit
    BOOST_TEST(gh == 2);
    BOOST_TEST(gw == 2);
    o.max_patches = 16;
    io::image_grid(40, 30, o, gh, gw);
    BOOST_TEST(gh == 4);
    BOOST_TEST(gw == 4);
    io::image_grid(40, 80, o, gh, gw);  // 10×20 = 200 → s 0.283: 2.83 → 2, 5.66 → 6
    BOOST_TEST(gh == 2);
    BOOST_TEST(gw == 6);
}

// A constant image resized to its grid normalises to (v/255 − 0.5)/0.5 everywhere.
BOOST_AUTO_TEST_CASE(preprocess_resizes_and_normalises) {
    io::RawImage raw;
    raw.height = 10, raw.width = 14;
    raw.rgb.assign(10 * 14 * 3, 0);
    for (size_t i = 0; i < raw.rgb.size(); i += 3)
        raw.rgb[i] = 255, raw.rgb[i + 1] = 51, raw.rgb[i + 2] = 0;
    io::ImageOptions o;
    o.patch = 4, o.unit = 2;
    const io::Image img = io::preprocess_image(raw, o);
    BOOST_TEST(img.grid_h == 2);  // 2.5 patches → 2 (nearest unit)
    BOOST_TEST(img.grid_w == 4);  // 3.5 → 4
    const int64_t plane = img.grid_h * 4 * img.grid_w * 4;
    BOOST_REQUIRE(img.pixels.size() == static_cast<size_t>(3 * plane));
    const float expect[3] = {1.0f, 51.0f / 255.0f * 2.0f - 1.0f, -1.0f};
    for (int c = 0; c < 3; ++c)
        for (int64_t i = 0; i < plane; ++i)
            BOOST_TEST(img.pixels[c * plane + i] == expect[c], boost::test_tools::tolerance(1e-5f));
}

BOOST_AUTO_TEST_CASE(unreadable_and_oversized_images_are_bad_input) {
    BOOST_CHECK_EXCEPTION(io::decode_image(tmp("missing.png"), 1 << 20), Error, bad_input);
    const std::string text = tmp("text.png");
    std::ofstream(text) << "this is not an image at all";
    BOOST_CHECK_EXCEPTION(io::decode_image(text, 1 << 20), Error, bad_input);
    const std::string png = tmp("cut.png"), cut = tmp("cut2.png");
    write_png(png, pattern(32, 32), 32, 32, PNG_FORMAT_RGB);
    {
        std::ifstream in(png, std::ios::binary);
        std::string bytes((std::istreambuf_iterator<char>(in)), {});
        std::ofstream(cut, std::ios::binary) << bytes.substr(0, bytes.size() / 2);
    }
    BOOST_CHECK_EXCEPTION(io::decode_image(cut, 1 << 20), Error, bad_input);
    BOOST_CHECK_EXCEPTION(io::decode_image(png, 32 * 32 - 1), Error, bad_input);
    const std::string jpg = tmp("big.jpg");
    write_jpeg(jpg, pattern(16, 16), 16, 16);
    BOOST_CHECK_EXCEPTION(io::decode_image(jpg, 100), Error, bad_input);
    try {
        io::decode_image(jpg, 100);
    } catch (const Error& e) {
        BOOST_TEST(std::string(e.what()).find(jpg) != std::string::npos);
        BOOST_TEST(std::string(e.what()).find("oversized") != std::string::npos);
    }
    for (const std::string& f : {text, png, cut, jpg})
        fs::remove(f);
}

BOOST_AUTO_TEST_SUITE_END()
