// The ops on a Ctx (hymoe/backend/ops.h) on a CUDA context against the same ops on the CPU
// context, in fp32 and bf16: the one device switch (src/backend/ops.cpp) reaches the right kernel
// with the right arguments for every op (linear, RMSNorm, SiLU, sigmoid, ReLU², SwiGLU, the
// residual add, softmax with a masked entry, the causal conv over two calls through its tail, top-k
// rows), an f32 x times a bf16 weight, and the Scratch of a CUDA context gives arena tensors back
// at its end.
#include <cmath>
#include <cstdint>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "cuda_test.h"
#include "hymoe/backend/cuda_gemm.h"
#include "hymoe/backend/ops.h"

namespace utf = boost::unit_test;
using namespace hymoe;
using namespace hymoe::cuda_test;

namespace {

// A CUDA context over a test's stream and arena.
}  // namespace

BOOST_AUTO_TEST_SUITE(cuda_ctx_ops, *utf::label("cuda"))

BOOST_AUTO_TEST_CASE(elementwise_norm_and_linear, *utf::precondition(need_gpu)) {
    GpuCtx gc;
    const backend::Ctx cpu = backend::cpu_ctx();
    for (DType t : {DType::f32, DType::bf16}) {
        Buffer x = random({9, 96}, 40, t), w = random({64, 96}, 41, t), g = random({96}, 42, t);
        Buffer y(DType::f32, {9, 64});
        Tensor dy = gc.g.arena.tensor(t, {9, 64});
        ops::linear(cpu, x.view(), w.view(), y.view());
        ops::linear(gc.ctx, gc.up(x, t), gc.up(w, t), dy);
        expect_close("linear", dy, y, gc.g.s);

        Buffer n(DType::f32, {9, 96});
        Tensor dn = gc.g.arena.tensor(t, {9, 96});
        ops::rms_norm(cpu, x.view(), g.view(), 1e-6f, n.view());
        ops::rms_norm(gc.ctx, gc.up(x, t), gc.up(g, t), 1e-6f, dn);
        expect_close("rms_norm", dn, n, gc.g.s);

        Tensor da = gc.up(x, t);
        ops::silu_inplace(cpu, x.view());
        ops::silu_inplace(gc.ctx, da);
        expect_close("silu_inplace", da, x, gc.g.s);
        ops::sigmoid_inplace(cpu, x.view());
        ops::sigmoid_inplace(gc.ctx, da);
        expect_close("sigmoid_inplace", da, x, gc.g.s);
        ops::add_inplace(cpu, x.view(), n.view());
        ops::add_inplace(gc.ctx, da, dn);
        expect_close("add_inplace", da, x, gc.g.s);

        Buffer r = random({9, 96}, 43, t);
        Tensor dr = gc.up(r, t);
        ops::relu2_inplace(cpu, r.view());
        ops::relu2_inplace(gc.ctx, dr);
        expect_close("relu2_inplace", dr, r, gc.g.s);

        Buffer gate = random({9, 96}, 44, t), s(DType::f32, {9, 96});
        Tensor ds = gc.g.arena.tensor(t, {9, 96});
        ops::swiglu(cpu, gate.view(), r.view(), s.view());
        ops::swiglu(gc.ctx, gc.up(gate, t), dr, ds);
        expect_close("swiglu", ds, s, gc.g.s);
    }
}

BOOST_AUTO_TEST_CASE(softmax_conv_top_k, *utf::precondition(need_gpu)) {
    GpuCtx gc;
    const backend::Ctx cpu = backend::cpu_ctx();
    Buffer x = random({4, 300}, 50, DType::f32, 3.0f);
    x.ptr<float>()[7] = -INFINITY;
    Tensor dx = gc.up(x, DType::f32);
    Buffer idx(DType::i64, {4, 16});
    Tensor didx = gc.g.arena.tensor(DType::i64, {4, 16});
    ops::top_k_rows(cpu, x.view(), 16, idx.view());
    ops::top_k_rows(gc.ctx, dx, 16, didx);
    std::vector<int64_t> got(64);
    cu::copy_to_host(got.data(), didx.data, 64 * sizeof(int64_t), gc.g.s);
    gc.g.s.synchronize();
    for (int64_t i = 0; i < 64; ++i)
        BOOST_TEST(got[static_cast<size_t>(i)] == idx.ptr<int64_t>()[i]);
    ops::softmax_rows(cpu, x.view());
    ops::softmax_rows(gc.ctx, dx);
    expect_close("softmax_rows", dx, x, gc.g.s);

    const Buffer u = random({11, 40}, 51, DType::f32), w = random({40, 4}, 52, DType::f32);
    Buffer tail(DType::f32, {3, 40}), y(DType::f32, {11, 40});
    Tensor dtail = gc.up(tail, DType::f32), du = gc.up(u, DType::f32), dw = gc.up(w, DType::f32);
    Tensor dy = gc.g.arena.tensor(DType::f32, {11, 40});
    for (int call = 0; call < 2; ++call) {  // the second call continues through the tail
        ops::causal_conv(cpu, u.view(), w.view(), tail.view(), y.view());
        ops::causal_conv(gc.ctx, du, dw, dtail, dy);
        expect_close("causal_conv", dy, y, gc.g.s);
        expect_close("causal_conv tail", dtail, tail, gc.g.s);
    }
}

// An f32 x times a bf16 weight (a bf16 model's activations): the CPU's gemm_w against the CUDA
// context's bf16 copy of x, within the bf16 tolerance (the CPU's portable path keeps x exact).
BOOST_AUTO_TEST_CASE(linear_of_f32_x_and_bf16_weight, *utf::precondition(need_gpu)) {
    GpuCtx gc;
    const Buffer x = random({9, 96}, 45, DType::f32), w = random({64, 96}, 46, DType::bf16);
    Buffer w16(DType::bf16, {64, 96}), y(DType::f32, {9, 64});
    for (int64_t i = 0; i < w.view().numel(); ++i)
        w16.ptr<uint16_t>()[i] = float_to_bf16(w.ptr<float>()[i]);
    ops::linear(backend::cpu_ctx(), x.view(), w16.view(), y.view());
    Tensor dy = gc.g.arena.tensor(DType::f32, {9, 64});
    ops::linear(gc.ctx, gc.up(x, DType::f32), gc.up(w, DType::bf16), dy);
    Buffer got = to_host(dy, gc.g.s);
    const double err = rel_error(got.ptr<float>(), y.ptr<float>(), y.view().numel());
    BOOST_TEST_INFO("linear f32 x bf16 w: normalised error " << err);
    BOOST_TEST(err < tolerance(DType::bf16));
}

BOOST_AUTO_TEST_CASE(scratch_returns_arena_blocks, *utf::precondition(need_gpu)) {
    GpuCtx gc;
    const size_t before = gc.g.arena.book().used();
    {
        backend::Scratch scratch(gc.ctx);
        Tensor a = scratch(DType::f32, {128, 64});
        Tensor b = scratch(DType::bf16, {3});
        BOOST_TEST((a.device == Device::cuda));
        BOOST_TEST((b.dtype == DType::bf16));
        BOOST_TEST(gc.g.arena.book().used() > before);
    }
    BOOST_TEST(gc.g.arena.book().used() == before);
}

BOOST_AUTO_TEST_SUITE_END()
