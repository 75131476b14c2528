// Every CUDA kernel against its CPU op (hymoe/backend/ops.h) on random inputs, in fp32 and bf16
// (inputs rounded to bf16 for both sides), by normalised error: RMSNorm, LayerNorm, l2norm,
// SiLU, sigmoid, SwiGLU, softmax with −inf entries and an all-masked row, RoPE in both pair
// layouts on strided heads at scattered positions, top-k with many ties (indices compared
// exactly), the causal conv over three chunks continued through its tail (one chunk shorter than
// the tail), and the vocab-parallel embedding gather (exact).
#include <array>
#include <cmath>
#include <cstdint>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "cuda_test.h"
#include "hymoe/backend/cuda_ops.h"
#include "hymoe/backend/ops.h"

namespace utf = boost::unit_test;
using namespace hymoe;
using namespace hymoe::cuda_test;

namespace {

const DType kTypes[] = {DType::f32, DType::bf16};

// The device result `dev` against the CPU's `want`, within the tolerance of dev's dtype.
void expect_close(const char* what, const Tensor& dev, const Buffer& want, const cu::Stream& s) {
    Buffer got = to_host(dev, s);
    const double err = rel_error(got.ptr<float>(), want.ptr<float>(), want.view().numel());
    BOOST_TEST_INFO(what << " " << to_string(dev.dtype) << ": normalised error " << err);
    BOOST_TEST(err < tolerance(dev.dtype));
}

}  // namespace

BOOST_AUTO_TEST_SUITE(cuda_ops, *utf::label("cuda"))

BOOST_AUTO_TEST_CASE(rms_norm_layer_norm_l2norm, *utf::precondition(need_gpu)) {
    Gpu g;
    for (DType t : kTypes) {
        for (int64_t dim : {int64_t{7}, int64_t{1000}}) {
            Buffer x = random({3, 5, dim}, 10, t, 3.0f);
            Buffer w = random({dim}, 11, t);
            Buffer b = random({dim}, 12, t);
            Tensor dx = to_device(x.view(), t, g.arena, g.s);
            Tensor dw = to_device(w.view(), t, g.arena, g.s);
            Tensor db = to_device(b.view(), t, g.arena, g.s);

            Buffer y(DType::f32, x.view().shape);
            Tensor dy = g.arena.tensor(t, x.view().shape);
            ops::rms_norm(x.view(), w.view(), 1e-6f, y.view());
            cu::rms_norm(g.s, dx, dw, 1e-6f, dy);
            expect_close("rms_norm", dy, y, g.s);

            ops::layer_norm(x.view(), w.view(), b.view(), 1e-5f, y.view());
            cu::layer_norm(g.s, dx, dw, db, 1e-5f, dy);
            expect_close("layer_norm", dy, y, g.s);

            ops::rms_norm(x.view(), w.view(), 1e-6f, x.view());  // in place, y aliasing x
            cu::rms_norm(g.s, dx, dw, 1e-6f, dx);
            expect_close("rms_norm in place", dx, x, g.s);

            ops::l2_norm_rows(x.ptr<float>(), 15, dim);
            cu::l2_norm_rows(g.s, dx);
            expect_close("l2_norm_rows", dx, x, g.s);
        }
    }
}

BOOST_AUTO_TEST_CASE(silu_sigmoid_swiglu, *utf::precondition(need_gpu)) {
    Gpu g;
    for (DType t : kTypes) {
        Buffer x = random({33, 257}, 20, t, 4.0f);
        Buffer u = random({33, 257}, 21, t);
        Tensor dx = to_device(x.view(), t, g.arena, g.s);
        Tensor du = to_device(u.view(), t, g.arena, g.s);
        Tensor dy = g.arena.tensor(t, {33, 257});
        Buffer y(DType::f32, {33, 257});
        ops::swiglu(x.view(), u.view(), y.view());
        cu::swiglu(g.s, dx, du, dy);
        expect_close("swiglu", dy, y, g.s);

        Tensor dx2 = to_device(x.view(), t, g.arena, g.s);
        Buffer x2 = random({33, 257}, 20, t, 4.0f);
        ops::silu_inplace(x.view());
        cu::silu_inplace(g.s, dx);
        expect_close("silu_inplace", dx, x, g.s);
        ops::sigmoid_inplace(x2.view());
        cu::sigmoid_inplace(g.s, dx2);
        expect_close("sigmoid_inplace", dx2, x2, g.s);
    }
}

BOOST_AUTO_TEST_CASE(softmax_with_masks, *utf::precondition(need_gpu)) {
    Gpu g;
    for (DType t : kTypes) {
        for (int64_t n : {int64_t{5}, int64_t{3001}}) {
            const int64_t rows = 6;
            Buffer x = random({rows, n}, 30, t, 5.0f);
            for (int64_t i = 0; i < n; ++i) {
                if (i % 3 == 1)
                    x.ptr<float>()[i] = -INFINITY;      // row 0: partly masked
                x.ptr<float>()[2 * n + i] = -INFINITY;  // row 2: every entry masked
            }
            Tensor dx = to_device(x.view(), t, g.arena, g.s);
            ops::softmax_rows(x.ptr<float>(), rows, n);
            cu::softmax_rows(g.s, dx);
            expect_close("softmax_rows", dx, x, g.s);
            Buffer got = to_host(dx, g.s);
            BOOST_TEST(got.ptr<float>()[1] == 0.0f);          // a masked entry
            BOOST_TEST(got.ptr<float>()[2 * n + 1] == 0.0f);  // the masked row
        }
    }
}

BOOST_AUTO_TEST_CASE(rope_both_layouts_strided, *utf::precondition(need_gpu)) {
    Gpu g;
    const int64_t n_tok = 9, n_head = 3, head_dim = 80, token_stride = n_head * head_dim + 16;
    const int64_t offset = 16, rot = 64;  // rotate dims [16, 80) of each head, as MLA's rope part
    const std::vector<int64_t> pos = {0, 1, 2, 7, 100, 4095, 4096, 65000, 3};
    Tensor dpos = to_device_i64(pos, g.arena, g.s);
    for (const ops::RopeFreqs& f : {ops::rope_freqs(rot, 10000.0),
                                    ops::rope_freqs_yarn(rot, 10000.0, 40.0, 4096, 32, 1, 1.2)}) {
        for (bool interleaved : {true, false}) {
            for (DType t : kTypes) {
                Buffer x = random({n_tok, token_stride}, 40, t);
                Tensor dx = to_device(x.view(), t, g.arena, g.s);
                ops::rope(x.ptr<float>() + offset,
                          n_tok,
                          n_head,
                          token_stride,
                          head_dim,
                          pos.data(),
                          f,
                          interleaved);
                const size_t es = dtype_size(t);
                cu::rope(g.s,
                         t,
                         dx.ptr<char>() + offset * static_cast<int64_t>(es),
                         n_tok,
                         n_head,
                         token_stride,
                         head_dim,
                         dpos.ptr<int64_t>(),
                         f,
                         interleaved);
                BOOST_TEST_INFO("interleaved " << interleaved << " mscale " << f.mscale);
                expect_close("rope", dx, x, g.s);
            }
        }
    }
}

BOOST_AUTO_TEST_CASE(top_k_ties_to_the_smaller_index, *utf::precondition(need_gpu)) {
    Gpu g;
    for (auto [rows, n, k] : {std::array<int64_t, 3>{4, 256, 8}, {3, 64, 64}, {2, 5000, 37}}) {
        Buffer x(DType::f32, {rows, n});
        Philox rng(5, static_cast<uint32_t>(n), 0);
        for (int64_t i = 0; i < rows * n; ++i)  // few distinct values: many ties
            x.ptr<float>()[i] = std::floor(rng.uniform() * 12.0f) - 6.0f;
        x.ptr<float>()[3] = -INFINITY;
        Tensor dx = to_device(x.view(), DType::f32, g.arena, g.s);
        Tensor didx = g.arena.tensor(DType::i64, {rows, k});
        cu::top_k_rows(g.s, dx, k, didx);
        std::vector<int64_t> got(static_cast<size_t>(rows * k)), want(got.size());
        cu::copy_to_host(got.data(), didx.data, got.size() * sizeof(int64_t), g.s);
        g.s.synchronize();
        for (int64_t r = 0; r < rows; ++r)
            ops::top_k(x.ptr<float>() + r * n, n, k, want.data() + r * k);
        BOOST_TEST_INFO("rows " << rows << " n " << n << " k " << k);
        BOOST_TEST(got == want, boost::test_tools::per_element());
    }
}

BOOST_AUTO_TEST_CASE(causal_conv_continues_through_its_tail, *utf::precondition(need_gpu)) {
    Gpu g;
    const int64_t C = 300, W = 4;
    for (DType t : kTypes) {
        Buffer w = random({C, W}, 50, t, 0.5f);
        Buffer tail(DType::f32, {W - 1, C});
        Tensor dw = to_device(w.view(), t, g.arena, g.s);
        Tensor dtail = to_device(tail.view(), t, g.arena, g.s);  // a new sequence: zeros
        uint32_t stream = 51;
        for (int64_t T_len : {int64_t{7}, int64_t{2}, int64_t{1}, int64_t{5}}) {
            Buffer u = random({T_len, C}, stream++, t);
            Buffer y(DType::f32, {T_len, C});
            Tensor du = to_device(u.view(), t, g.arena, g.s);
            Tensor dy = g.arena.tensor(t, {T_len, C});
            ops::causal_conv(u.view(), w.view(), tail.view(), y.view());
            cu::causal_conv(g.s, du, dw, dtail, dy);
            BOOST_TEST_INFO("chunk of " << T_len);
            expect_close("causal_conv y", dy, y, g.s);
            expect_close("causal_conv tail", dtail, tail, g.s);
        }
    }
}

BOOST_AUTO_TEST_CASE(embedding_gather_of_a_vocab_shard, *utf::precondition(need_gpu)) {
    Gpu g;
    const int64_t rows = 50, d = 129, lo = 100;  // this rank holds tokens [100, 150)
    const std::vector<int64_t> tokens = {100, 149, 3, 120, 150, 99, 125, 125};
    for (DType t : kTypes) {
        Buffer table = random({rows, d}, 60, t);
        Tensor dtable = to_device(table.view(), t, g.arena, g.s);
        Tensor dtok = to_device_i64(tokens, g.arena, g.s);
        const int64_t n = static_cast<int64_t>(tokens.size());
        Tensor dh = g.arena.tensor(t, {n, d});
        cu::embed_rows(g.s, dtable, dtok, lo, dh);
        Buffer want(DType::f32, {n, d});  // model.cpp's embed_tokens on one rank's shard
        for (int64_t i = 0; i < n; ++i)
            if (tokens[i] >= lo && tokens[i] < lo + rows)
                for (int64_t c = 0; c < d; ++c)
                    want.ptr<float>()[i * d + c] = table.ptr<float>()[(tokens[i] - lo) * d + c];
        Buffer got = to_host(dh, g.s);
        BOOST_TEST(rel_error(got.ptr<float>(), want.ptr<float>(), n * d) == 0.0);
    }
}

BOOST_AUTO_TEST_SUITE_END()
