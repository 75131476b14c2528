// The vision tower's ops (hymoe/backend/ops_vision.h), CPU forms and the same ops on a CPU Ctx,
// against plain references written from their definitions: the bias with both GELUs (double
// formulas), the 2-D RoPE (each pair turned by its own angle, in double), the attention of
// packed images (a double softmax per image and head, images never seeing each other), the
// gathered means (sums in double), the copy back; the heads taken at once within a budget.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "hymoe/backend/ops.h"
#include "hymoe/backend/ops_vision.h"
#include "hymoe/core/error.h"
#include "hymoe/core/rng.h"

namespace {

using namespace hymoe;

Buffer normal(Shape shape, uint32_t stream, float scale = 1.0f) {
    Buffer b(DType::f32, std::move(shape));
    Philox rng(77, stream, 0);
    rng.fill_normal(b.ptr<float>(), static_cast<size_t>(b.view().numel()), 0.0f, scale);
    return b;
}

// max |got − want| / max |want|
double rel_err(const float* got, const std::vector<double>& want) {
    double num = 0, den = 0;
    for (size_t i = 0; i < want.size(); ++i) {
        num = std::max(num, std::fabs(static_cast<double>(got[i]) - want[i]));
        den = std::max(den, std::fabs(want[i]));
    }
    return num / den;
}

bool same(const Buffer& a, const Buffer& b) {
    const int64_t n = a.view().numel();
    if (n != b.view().numel())
        return false;
    for (int64_t i = 0; i < n; ++i)
        if (a.ptr<float>()[i] != b.ptr<float>()[i])
            return false;
    return true;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(vision_ops)

BOOST_AUTO_TEST_CASE(bias_and_both_gelus_against_the_formulas) {
    const int64_t n = 7, w = 13;
    const Buffer x = normal({n, w}, 1, 2.0f), b = normal({w}, 2);
    for (ops::BiasAct act : {ops::BiasAct::none, ops::BiasAct::gelu_tanh, ops::BiasAct::gelu_erf}) {
        Buffer y = normal({n, w}, 1, 2.0f);
        ops::bias_act(y.view(), b.view(), act);
        std::vector<double> want(static_cast<size_t>(n * w));
        for (int64_t r = 0; r < n; ++r)
            for (int64_t j = 0; j < w; ++j) {
                const double u = static_cast<double>(x.ptr<float>()[r * w + j] + b.ptr<float>()[j]);
                double g = u;
                if (act == ops::BiasAct::gelu_tanh)
                    g = 0.5 * u *
                        (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (u + 0.044715 * u * u * u)));
                if (act == ops::BiasAct::gelu_erf)
                    g = 0.5 * u * (1.0 + std::erf(u / std::sqrt(2.0)));
                want[static_cast<size_t>(r * w + j)] = g;
            }
        const double e = rel_err(y.ptr<float>(), want);
        BOOST_TEST(e <= (act == ops::BiasAct::none ? 0.0 : 1e-6), "act " << static_cast<int>(act));
    }
}

// Two images' rows of [q (2 heads) | k (2 heads) | 8 more columns]; q and k turned as 4 heads.
BOOST_AUTO_TEST_CASE(rope_2d_turns_each_pair_by_its_row_or_column) {
    const int64_t H = 4, dh = 8, width = H * dh + 8, n = 6 + 4;
    const std::vector<int32_t> pos = {0, 0, 0, 1, 0, 2, 1, 0, 1, 1, 1, 2,  // a 2×3 grid
                                      0, 0, 0, 1, 1, 0, 1, 1};             // a 2×2 grid
    const Buffer x = normal({n, width}, 3);
    Buffer y = normal({n, width}, 3), z = normal({n, width}, 3);
    ops::rope_2d(y.ptr<float>(), n, H, dh, width, pos.data());
    const Tensor dpos{const_cast<int32_t*>(pos.data()), DType::i32, Device::cpu, {n, 2}};
    Tensor zv = z.view();
    ops::rope_2d(backend::cpu_ctx(), zv, H, dh, dpos);
    BOOST_TEST(same(y, z));
    std::vector<double> want(static_cast<size_t>(n * width));
    for (int64_t t = 0; t < n; ++t)
        for (int64_t c = 0; c < width; ++c)
            want[static_cast<size_t>(t * width + c)] = x.ptr<float>()[t * width + c];
    for (int64_t t = 0; t < n; ++t)
        for (int64_t h = 0; h < H; ++h)
            for (int64_t j = 0; j < dh / 2; ++j) {
                const double theta = std::pow(10000.0, -4.0 * static_cast<double>(j / 2) / dh);
                const double a = (j % 2 == 0 ? pos[2 * t + 1] : pos[2 * t]) * theta;
                const int64_t at = t * width + h * dh + 2 * j;
                const double u = x.ptr<float>()[at], v = x.ptr<float>()[at + 1];
                want[static_cast<size_t>(at)] = u * std::cos(a) - v * std::sin(a);
                want[static_cast<size_t>(at + 1)] = u * std::sin(a) + v * std::cos(a);
            }
    BOOST_TEST(rel_err(y.ptr<float>(), want) <= 1e-6);
    for (int64_t t = 0; t < n; ++t)  // the columns past the heads untouched
        for (int64_t c = H * dh; c < width; ++c)
            BOOST_TEST(y.ptr<float>()[t * width + c] == x.ptr<float>()[t * width + c]);
}

// Three images of 5, 1 and 9 patches, 3 heads of 4: each image's softmax over its own keys.
BOOST_AUTO_TEST_CASE(attention_of_packed_images_against_a_softmax_per_image_and_head) {
    const std::vector<int64_t> lengths = {5, 1, 9};
    const int64_t H = 3, dh = 4, C = H * dh, n = 15;
    const Buffer qkv = normal({n, 3 * C}, 4);
    Buffer o(DType::f32, {n, C}), oc(DType::f32, {n, C});
    ops::vision_attention(qkv.view(), lengths, H, o.view());
    ops::vision_attention(backend::cpu_ctx(), qkv.view(), lengths, H, 0, oc.view());
    BOOST_TEST(same(o, oc));
    std::vector<double> want(static_cast<size_t>(n * C));
    const float* q = qkv.ptr<float>();
    int64_t off = 0;
    for (int64_t m : lengths) {
        for (int64_t h = 0; h < H; ++h)
            for (int64_t i = 0; i < m; ++i) {
                std::vector<double> p(static_cast<size_t>(m));
                double mx = -1e300, sum = 0;
                for (int64_t j = 0; j < m; ++j) {
                    double s = 0;
                    for (int64_t e = 0; e < dh; ++e)
                        s += static_cast<double>(q[(off + i) * 3 * C + h * dh + e]) *
                             static_cast<double>(q[(off + j) * 3 * C + C + h * dh + e]);
                    p[static_cast<size_t>(j)] = s / std::sqrt(static_cast<double>(dh));
                    mx = std::max(mx, p[static_cast<size_t>(j)]);
                }
                for (double& s : p)
                    sum += (s = std::exp(s - mx));
                for (int64_t e = 0; e < dh; ++e) {
                    double acc = 0;
                    for (int64_t j = 0; j < m; ++j)
                        acc += p[static_cast<size_t>(j)] / sum *
                               static_cast<double>(q[(off + j) * 3 * C + 2 * C + h * dh + e]);
                    want[static_cast<size_t>((off + i) * C + h * dh + e)] = acc;
                }
            }
        off += m;
    }
    BOOST_TEST(rel_err(o.ptr<float>(), want) <= 1e-5);
    // an image of one patch attends to itself alone: its v
    for (int64_t c = 0; c < C; ++c)
        BOOST_TEST(std::fabs(o.ptr<float>()[5 * C + c] - q[5 * 3 * C + 2 * C + c]) <= 1e-6f);
    BOOST_CHECK_THROW(ops::vision_attention(qkv.view(), {5, 1, 8}, H, o.view()), Error);
}

BOOST_AUTO_TEST_CASE(gathered_means_against_sums_in_double) {
    const int64_t m = 9, w = 6, r = 4, g = 3;
    const Buffer x = normal({m, w}, 5);
    std::vector<int64_t> rows = {0, 1, 2, 8, 7, 6, 4, 4, 4, 3, 0, 5};
    const Tensor idx{rows.data(), DType::i64, Device::cpu, {r, g}};
    Buffer out(DType::f32, {r, w}), outc(DType::f32, {r, w});
    ops::gather_mean_rows(x.view(), idx, out.view());
    ops::gather_mean_rows(backend::cpu_ctx(), x.view(), idx, outc.view());
    BOOST_TEST(same(out, outc));
    std::vector<double> want(static_cast<size_t>(r * w));
    for (int64_t i = 0; i < r; ++i)
        for (int64_t k = 0; k < w; ++k) {
            double s = 0;
            for (int64_t j = 0; j < g; ++j)
                s += static_cast<double>(
                    x.ptr<float>()[rows[static_cast<size_t>(i * g + j)] * w + k]);
            want[static_cast<size_t>(i * w + k)] = s / g;
        }
    BOOST_TEST(rel_err(out.ptr<float>(), want) <= 1e-6);
    std::vector<int64_t> copies = {8, 0};  // g = 1 copies the rows as they are
    const Tensor one{copies.data(), DType::i64, Device::cpu, {2, 1}};
    Buffer copied(DType::f32, {2, w});
    ops::gather_mean_rows(x.view(), one, copied.view());
    for (int64_t k = 0; k < w; ++k) {
        BOOST_TEST(copied.ptr<float>()[k] == x.ptr<float>()[8 * w + k]);
        BOOST_TEST(copied.ptr<float>()[w + k] == x.ptr<float>()[k]);
    }
    rows[5] = 9;  // past x's rows
    BOOST_CHECK_THROW(ops::gather_mean_rows(x.view(), idx, out.view()), Error);
}

BOOST_AUTO_TEST_CASE(linear_with_bias_is_the_product_then_the_bias) {
    const Buffer x = normal({5, 12}, 6), w = normal({7, 12}, 7), b = normal({7}, 8);
    for (ops::BiasAct act : {ops::BiasAct::none, ops::BiasAct::gelu_tanh, ops::BiasAct::gelu_erf}) {
        Buffer y(DType::f32, {5, 7}), want(DType::f32, {5, 7});
        ops::linear_bias(backend::cpu_ctx(), x.view(), w.view(), b.view(), act, y.view());
        ops::linear(x.view(), w.view(), want.view());
        ops::bias_act(want.view(), b.view(), act);
        BOOST_TEST(same(y, want), "act " << static_cast<int>(act));
    }
}

BOOST_AUTO_TEST_CASE(heads_at_once_and_the_copy_back) {
    BOOST_TEST(ops::heads_at_once(10, 6, 0) == 1);
    BOOST_TEST(ops::heads_at_once(10, 6, 4 * 100 * 4 + 399) == 4);
    BOOST_TEST(ops::heads_at_once(10, 6, int64_t{1} << 40) == 6);
    // the CPU scores one head at a time whatever the room
    BOOST_TEST(ops::vision_heads_at_once(backend::cpu_ctx(), 10, 6, int64_t{1} << 40) == 1);
    const Buffer src = normal({3, 4}, 9);
    Buffer dst(DType::f32, {12});
    ops::download(backend::cpu_ctx(), src.view(), dst.view());
    BOOST_TEST(same(src, dst));
    Buffer small(DType::f32, {11});
    BOOST_CHECK_THROW(ops::download(backend::cpu_ctx(), src.view(), small.view()), Error);
}

// The switch's checks reach the vision ops: a device tensor on the CPU context, and a CUDA
// context without its stream (or in a build without CUDA), are refused naming the op.
BOOST_AUTO_TEST_CASE(a_tensor_or_context_of_another_device_is_refused) {
    Buffer x = normal({4, 3}, 10), b = normal({3}, 11), out(DType::f32, {4, 3});
    Tensor on_gpu = x.view();
    on_gpu.device = Device::cuda;
    auto names = [](const char* op) {
        return [op](const Error& e) { return std::string(e.what()).find(op) != std::string::npos; };
    };
    BOOST_CHECK_EXCEPTION(
        ops::linear_bias(
            backend::cpu_ctx(), on_gpu, x.view(), b.view(), ops::BiasAct::none, out.view()),
        Error,
        names("linear_bias"));
    backend::Ctx gpu;
    gpu.device = Device::cuda;
    BOOST_CHECK_EXCEPTION(ops::download(gpu, on_gpu, out.view()), Error, names("download"));
}

BOOST_AUTO_TEST_SUITE_END()
