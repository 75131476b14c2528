// Every CUDA kernel against its CPU op (hymoe/backend/ops.h) on random inputs, in fp32 and bf16
// (inputs rounded to bf16 for both sides), by normalised error: RMSNorm, LayerNorm, l2norm,
// SiLU, sigmoid, SwiGLU, softmax with −inf entries and an all-masked row, RoPE in both pair
// layouts on strided heads at scattered positions, top-k on short and long rows with many ties
// (indices compared exactly), the causal conv over four chunks continued through its tail (two
// chunks shorter than the tail), the residual add, gate product and scale, the MoE dispatch (exact)
// and combine against model/moe.cpp's loops, and the vocab-parallel embedding gather (exact).
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

BOOST_AUTO_TEST_CASE(residual_add_gate_product_scale, *utf::precondition(need_gpu)) {
    Gpu g;
    for (DType t : kTypes) {
        Buffer x = random({17, 300}, 25, t), y = random({17, 300}, 26, t);
        Tensor dx = to_device(x.view(), t, g.arena, g.s);
        Tensor dy = to_device(y.view(), t, g.arena, g.s);
        ops::add_inplace(x.view(), y.view());
        cu::add_inplace(g.s, dx, dy);
        expect_close("add_inplace", dx, x, g.s);
        for (int64_t i = 0; i < x.view().numel(); ++i)  // KDA's o ⊙ gate, then q · K^{-1/2}
            x.ptr<float>()[i] = x.ptr<float>()[i] * y.ptr<float>()[i] * 0.125f;
        cu::mul_inplace(g.s, dx, dy);
        cu::scale_inplace(g.s, dx, 0.125f);
        expect_close("mul_inplace, scale_inplace", dx, x, g.s);
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

// Both top-k paths: k passes (short rows, or k above the sort's limit) and the radix select of
// long rows, the latter with few and with many distinct values, a row masked (−inf) beyond its
// first 1000 entries (as causal DSA scores: k reaches into the −inf ties) and −0 beside +0.
BOOST_AUTO_TEST_CASE(top_k_ties_to_the_smaller_index, *utf::precondition(need_gpu)) {
    Gpu g;
    for (auto [rows, n, k, levels] : {std::array<int64_t, 4>{4, 256, 8, 12},
                                      {3, 64, 64, 12},
                                      {1, 5000, 4500, 12},
                                      {2, 5000, 37, 12},
                                      {2, 131072, 2048, 12},
                                      {3, 131072, 2048, 100000}}) {
        Buffer x(DType::f32, {rows, n});
        float* v = x.ptr<float>();
        Philox rng(5, static_cast<uint32_t>(n + levels), 0);
        for (int64_t i = 0; i < rows * n; ++i)  // `levels` distinct values: ties
            v[i] = std::floor(rng.uniform() * static_cast<float>(levels)) -
                   static_cast<float>(levels / 2);
        for (int64_t i = 0; i < rows * n; i += 3)
            if (v[i] == 0.0f)
                v[i] = -0.0f;
        v[3] = -INFINITY;
        if (rows > 1)
            for (int64_t i = 1000; i < n; ++i)
                v[n + i] = -INFINITY;
        Tensor dx = to_device(x.view(), DType::f32, g.arena, g.s);
        Tensor didx = g.arena.tensor(DType::i64, {rows, k});
        cu::top_k_rows(g.s, dx, k, didx);
        std::vector<int64_t> got(static_cast<size_t>(rows * k)), want(got.size());
        cu::copy_to_host(got.data(), didx.data, got.size() * sizeof(int64_t), g.s);
        g.s.synchronize();
        for (int64_t r = 0; r < rows; ++r)
            ops::top_k(v + r * n, n, k, want.data() + r * k);
        BOOST_TEST_INFO("rows " << rows << " n " << n << " k " << k << " levels " << levels);
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

// The row map of model/moe.cpp's plan_dispatch for a hand-made routing: slot (t, i) of token t
// to expert idx[t·k+i], dropped where kept is false; experts' rows contiguous, tokens ascending.
BOOST_AUTO_TEST_CASE(moe_dispatch_and_combine, *utf::precondition(need_gpu)) {
    Gpu g;
    const int64_t n_tok = 11, k = 3, E = 5, width = 70;
    std::vector<int64_t> idx(static_cast<size_t>(n_tok * k));
    std::vector<bool> kept(idx.size());
    std::vector<float> weight(idx.size());
    Philox rng(9, 0, 0);
    for (size_t a = 0; a < idx.size(); ++a) {
        idx[a] = static_cast<int64_t>(a * 7 % static_cast<size_t>(E));
        kept[a] = a % 5 != 3;
        weight[a] = rng.uniform();
    }
    std::vector<int64_t> count(static_cast<size_t>(E), 0), offset(static_cast<size_t>(E + 1), 0);
    for (size_t a = 0; a < idx.size(); ++a)
        count[static_cast<size_t>(idx[a])] += kept[a] ? 1 : 0;
    for (int64_t e = 0; e < E; ++e)
        offset[static_cast<size_t>(e + 1)] =
            offset[static_cast<size_t>(e)] + count[static_cast<size_t>(e)];
    std::vector<int64_t> cursor(offset.begin(), offset.end() - 1), row(idx.size(), -1);
    for (size_t a = 0; a < idx.size(); ++a)
        if (kept[a])
            row[a] = cursor[static_cast<size_t>(idx[a])]++;
    const int64_t n_rows = offset.back();
    Tensor drow = to_device_i64(row, g.arena, g.s);
    Tensor dweight = g.arena.tensor(DType::f32, {n_tok * k});
    cu::copy_to_device(dweight.data, weight.data(), weight.size() * sizeof(float), g.s);
    for (DType t : kTypes) {
        Buffer z = random({n_tok, width}, 70, t);
        Buffer want_in(DType::f32, {n_rows, width});
        for (size_t a = 0; a < row.size(); ++a)
            if (row[a] >= 0)
                for (int64_t j = 0; j < width; ++j)
                    want_in.ptr<float>()[row[a] * width + j] =
                        z.ptr<float>()[static_cast<int64_t>(a) / k * width + j];
        Tensor dz = to_device(z.view(), t, g.arena, g.s);
        Tensor din = g.arena.tensor(t, {n_rows, width});
        cu::moe_permute(g.s, dz, drow, k, din);
        Buffer got_in = to_host(din, g.s);
        BOOST_TEST(rel_error(got_in.ptr<float>(), want_in.ptr<float>(), n_rows * width) == 0.0);

        Buffer out = random({n_rows, width}, 71, t);  // stands for the experts' outputs
        Buffer want(DType::f32, {n_tok, width});
        for (int64_t tok = 0; tok < n_tok; ++tok)
            for (int64_t i = 0; i < k; ++i) {
                const int64_t r = row[static_cast<size_t>(tok * k + i)];
                if (r >= 0)
                    for (int64_t j = 0; j < width; ++j)
                        want.ptr<float>()[tok * width + j] +=
                            weight[static_cast<size_t>(tok * k + i)] *
                            out.ptr<float>()[r * width + j];
            }
        Tensor dout = to_device(out.view(), t, g.arena, g.s);
        Tensor dacc = g.arena.tensor(t, {n_tok, width});
        cu::moe_unpermute(g.s, dout, drow, dweight, k, dacc);
        expect_close("moe_unpermute", dacc, want, g.s);
        Tensor dacc32 = g.arena.tensor(DType::f32, {n_tok, width});  // the GPU model's fp32 sum
        cu::moe_unpermute(g.s, dout, drow, dweight, k, dacc32);
        expect_close("moe_unpermute into f32", dacc32, want, g.s);
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
