// The backward ops and AdamW (hymoe/backend/ops_backward.h) on a CUDA context against the same ops
// on the CPU context, fp32: RMSNorm's, the linear's (also an f32 dy of a bf16 weight), the
// softmax's (a masked entry) and RoPE's (strided heads, both pair layouts) input gradients, the
// MLP activations' (SwiGLU, ReLU²) and the sigmoid gate's backward, and three AdamW updates. The
// CPU forms are tests/unit/backend/test_ops_train.cpp's.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "cuda_test.h"
#include "hymoe/backend/cuda_gemm.h"
#include "hymoe/backend/ops.h"
#include "hymoe/backend/ops_backward.h"

namespace utf = boost::unit_test;
using namespace hymoe;
using namespace hymoe::cuda_test;

namespace {

Buffer copy_of(const Buffer& b) {
    Buffer c(DType::f32, b.view().shape);
    std::copy_n(b.ptr<float>(), b.view().numel(), c.ptr<float>());
    return c;
}

struct GpuCtx {
    Gpu g;
    cu::Blas blas{g.s, g.arena};
    backend::Ctx ctx;
    GpuCtx() {
        ctx.device = Device::cuda;
        ctx.stream = &g.s;
        ctx.arena = &g.arena;
        ctx.blas = &blas;
    }
    Tensor up(const Buffer& host, DType t = DType::f32) {
        return to_device(host.view(), t, g.arena, g.s);
    }
};

}  // namespace

BOOST_AUTO_TEST_SUITE(cuda_backward_ops, *utf::label("cuda"))

BOOST_AUTO_TEST_CASE(norm_linear_softmax_rope, *utf::precondition(need_gpu)) {
    GpuCtx gc;
    const backend::Ctx cpu = backend::cpu_ctx();
    const DType f = DType::f32;
    const Buffer x = random({9, 300}, 50, f), w = random({300}, 51, f),
                 dy = random({9, 300}, 52, f);
    Buffer dx(f, {9, 300});
    Tensor ddx = gc.g.arena.tensor(f, {9, 300});
    ops::rms_norm_backward(cpu, x.view(), w.view(), 1e-6f, dy.view(), dx.view());
    ops::rms_norm_backward(gc.ctx, gc.up(x), gc.up(w), 1e-6f, gc.up(dy), ddx);
    expect_close("rms_norm_backward", ddx, dx, gc.g.s);

    for (DType wt : {DType::f32, DType::bf16}) {
        const Buffer wl = random({300, 40}, 53, wt);
        Buffer l = random({9, 40}, 54, f);
        Tensor dl = gc.up(l);
        ops::linear_backward(cpu, dy.view(), wl.view(), l.view(), 1.0f);
        ops::linear_backward(gc.ctx, gc.up(dy), gc.up(wl, wt), dl, 1.0f);
        expect_close("linear_backward", dl, l, gc.g.s);
    }

    Buffer p = random({9, 300}, 55, f);
    p.ptr<float>()[7] = -INFINITY;
    ops::softmax_rows(p.ptr<float>(), 9, 300);
    Buffer dp = copy_of(dy);
    Tensor ddp = gc.up(dy);
    ops::softmax_rows_backward(cpu, p.view(), dp.view());
    ops::softmax_rows_backward(gc.ctx, gc.up(p), ddp);
    expect_close("softmax_rows_backward", ddp, dp, gc.g.s);

    const ops::RopeFreqs freqs = ops::rope_freqs(16, 10000.0);
    const std::vector<int64_t> pos{0, 1, 2, 3, 9, 40, 41, 100, 511};
    Buffer pos_h(DType::i64, {9});
    std::copy(pos.begin(), pos.end(), pos_h.ptr<int64_t>());
    const Tensor dpos = to_device_i64(pos, gc.g.arena, gc.g.s);
    for (bool interleaved : {true, false}) {
        Buffer r = copy_of(dy);
        Tensor dr = gc.up(dy);
        Tensor rv = r.view();
        ops::rope_backward(cpu, rv, 4, 3, 80, pos_h.view(), freqs, interleaved);
        ops::rope_backward(gc.ctx, dr, 4, 3, 80, dpos, freqs, interleaved);
        expect_close("rope_backward", dr, r, gc.g.s);
    }
}

BOOST_AUTO_TEST_CASE(activations_gate_adamw, *utf::precondition(need_gpu)) {
    GpuCtx gc;
    const backend::Ctx cpu = backend::cpu_ctx();
    const DType f = DType::f32;
    Buffer g = random({17, 96}, 60, f), u = random({17, 96}, 61, f), dh = random({17, 96}, 62, f);
    Tensor dg = gc.up(g), du = gc.up(u), dr = gc.up(u);
    Buffer r = copy_of(u);
    ops::swiglu_backward(cpu, g.view(), u.view(), dh.view());
    ops::swiglu_backward(gc.ctx, dg, du, gc.up(dh));
    expect_close("swiglu_backward gate", dg, g, gc.g.s);
    expect_close("swiglu_backward up", du, u, gc.g.s);
    ops::relu2_backward(cpu, r.view(), dh.view());
    ops::relu2_backward(gc.ctx, dr, gc.up(dh));
    expect_close("relu2_backward", dr, r, gc.g.s);

    Buffer o = random({17, 96}, 63, f), sg = random({17, 96}, 64, f), z(f, {17, 96});
    ops::sigmoid_inplace(sg.view());
    Buffer d = copy_of(dh);
    Tensor dd = gc.up(dh), dz = gc.g.arena.tensor(f, {17, 96});
    ops::sigmoid_gate_backward(cpu, d.view(), o.view(), sg.view(), z.view());
    ops::sigmoid_gate_backward(gc.ctx, dd, gc.up(o), gc.up(sg), dz);
    expect_close("sigmoid_gate_backward do", dd, d, gc.g.s);
    expect_close("sigmoid_gate_backward dz", dz, z, gc.g.s);

    Buffer p = random({1000}, 65, f), m(f, {1000}), v(f, {1000});
    Tensor dp = gc.up(p), dm = gc.up(m), dv = gc.up(v);
    ops::AdamWStep s;
    s.weight_decay = 0.01, s.grad_scale = 0.7;
    for (int t = 1; t <= 3; ++t) {
        const Buffer grad = random({1000}, 70 + t, f);
        s.lr = 1e-3 * t;
        s.c1 = 1 - std::pow(s.beta1, t);
        s.c2 = 1 - std::pow(s.beta2, t);
        ops::adamw(cpu, p.view(), grad.view(), m.view(), v.view(), s);
        ops::adamw(gc.ctx, dp, gc.up(grad), dm, dv, s);
    }
    expect_close("adamw p", dp, p, gc.g.s);
    expect_close("adamw m", dm, m, gc.g.s);
    expect_close("adamw v", dv, v, gc.g.s);
}

BOOST_AUTO_TEST_SUITE_END()
