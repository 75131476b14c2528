// The backward ops and AdamW (hymoe/backend/ops_backward.h) on a CUDA context against the same ops
// on the CPU context, fp32: RMSNorm's, the linear's (also an f32 dy of a bf16 weight), the
// softmax's (a masked entry) and RoPE's (strided heads, both pair layouts) input gradients, the
// MLP activations' (SwiGLU, ReLU²) and the sigmoid gate's backward, three AdamW updates, LoRA's
// row backward and the MLP's backward with adapters as factor views. The CPU forms are
// tests/unit/backend/test_ops_train.cpp's and test_lora_ops.cpp's.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "cuda_test.h"
#include "hymoe/backend/cuda_gemm.h"
#include "hymoe/backend/ops.h"
#include "hymoe/backend/ops_backward.h"
#include "hymoe/backend/ops_lora.h"
#include "hymoe/model/ffn_views.h"

namespace utf = boost::unit_test;
using namespace hymoe;
using namespace hymoe::cuda_test;

namespace {

Buffer copy_of(const Buffer& b) {
    Buffer c(DType::f32, b.view().shape);
    std::copy_n(b.ptr<float>(), b.view().numel(), c.ptr<float>());
    return c;
}

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
        // a bf16 weight's product rounds dy to bf16 (the CPU keeps it): bf16's tolerance
        const Buffer got = to_host(dl, gc.g.s);
        const double err = rel_error(got.ptr<float>(), l.ptr<float>(), l.view().numel());
        BOOST_TEST_INFO("linear_backward, " << to_string(wt) << " weight: normalised error "
                                            << err);
        BOOST_TEST(err < tolerance(wt));
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

// LoRA's row backward (ops::lora_rows_backward on scattered rows, trained and frozen) and the MLP's
// backward with factor views on a row list (model/ffn_views.h dense_ffn_backward): dx and the
// adapters' dA, dB.
BOOST_AUTO_TEST_CASE(lora_rows_and_ffn_backward, *utf::precondition(need_gpu)) {
    GpuCtx gc;
    const backend::Ctx cpu = backend::cpu_ctx();
    const DType f = DType::f32;
    const int64_t n = 11, in = 64, out = 48, r = 4;
    const std::vector<int64_t> idx{9, 0, 3, 4, 10};
    Buffer idx_h(DType::i64, {5});
    std::copy(idx.begin(), idx.end(), idx_h.ptr<int64_t>());
    const Tensor didx = to_device_i64(idx, gc.g.arena, gc.g.s);
    const Buffer A = random({r, in}, 80, f), B = random({out, r}, 81, f),
                 x = random({n, in}, 82, f), dy = random({n, out}, 83, f);
    for (bool train : {true, false}) {
        Buffer dA = random({r, in}, 84, f), dB = random({out, r}, 85, f),
               dx = random({n, in}, 86, f);
        Tensor ddA = gc.up(dA), ddB = gc.up(dB), ddx = gc.up(dx);
        Tensor hA = train ? dA.view() : Tensor{}, hB = train ? dB.view() : Tensor{};
        Tensor gA = train ? ddA : Tensor{}, gB = train ? ddB : Tensor{};
        Tensor hx = dx.view();
        ops::lora_rows_backward(
            cpu, idx_h.view(), A.view(), B.view(), 0.5f, x.view(), dy.view(), hA, hB, hx);
        ops::lora_rows_backward(
            gc.ctx, didx, gc.up(A), gc.up(B), 0.5f, gc.up(x), gc.up(dy), gA, gB, ddx);
        expect_close("lora_rows_backward dx", ddx, dx, gc.g.s);
        expect_close("lora_rows_backward dA", ddA, dA, gc.g.s);
        expect_close("lora_rows_backward dB", ddB, dB, gc.g.s);
    }

    const int64_t w = 64, inter = 96;
    for (model::ExpertAct act : {model::ExpertAct::swiglu, model::ExpertAct::relu2}) {
        const Buffer wg = random({inter, w}, 90, f, 0.125f), wu = random({inter, w}, 91, f, 0.125f),
                     wd = random({w, inter}, 92, f, 0.1f), xs = random({n, w}, 93, f),
                     dys = random({n, w}, 94, f);
        const Buffer Ag = random({r, w}, 95, f), Bg = random({inter, r}, 96, f),
                     Au = random({r, w}, 97, f), Bu = random({inter, r}, 98, f),
                     Ad = random({r, inter}, 99, f), Bd = random({w, r}, 100, f);
        Buffer gAg(f, {r, w}), gBg(f, {inter, r}), gAu(f, {r, w}), gBu(f, {inter, r}),
            gAd(f, {r, inter}), gBd(f, {w, r}), dxs(f, {n, w});
        Tensor dgAg = gc.up(gAg), dgBg = gc.up(gBg), dgAu = gc.up(gAu), dgBu = gc.up(gBu),
               dgAd = gc.up(gAd), dgBd = gc.up(gBd), ddxs = gc.up(dxs);
        const bool glu = act == model::ExpertAct::swiglu;
        model::DenseFfnViews hv{glu ? wg.view() : Tensor{}, wu.view(), wd.view(), nullptr, {}};
        hv.lora_views = {{},
                         {{Au.view(), Bu.view(), 0.5f, gAu.view(), gBu.view()}},
                         {{Ad.view(), Bd.view(), 1.5f, gAd.view(), gBd.view()}}};
        model::DenseFfnViews dv{glu ? gc.up(wg) : Tensor{}, gc.up(wu), gc.up(wd), nullptr, {}};
        dv.lora_views = {{},
                         {{gc.up(Au), gc.up(Bu), 0.5f, dgAu, dgBu}},
                         {{gc.up(Ad), gc.up(Bd), 1.5f, dgAd, dgBd}}};
        if (glu) {
            hv.lora_views.gate = {{Ag.view(), Bg.view(), 0.75f, gAg.view(), gBg.view()}};
            dv.lora_views.gate = {{gc.up(Ag), gc.up(Bg), 0.75f, dgAg, dgBg}};
        }
        const std::vector<model::LoraRowsView> hrows = {{0, idx_h.view()}}, drows = {{0, didx}};
        Tensor hdx = dxs.view();
        model::dense_ffn_backward(cpu, hv, act, xs.view(), dys.view(), hdx, &hrows);
        model::dense_ffn_backward(gc.ctx, dv, act, gc.up(xs), gc.up(dys), ddxs, &drows);
        expect_close("dense_ffn_backward dx", ddxs, dxs, gc.g.s);
        expect_close("ffn up dA", dgAu, gAu, gc.g.s);
        expect_close("ffn up dB", dgBu, gBu, gc.g.s);
        expect_close("ffn down dA", dgAd, gAd, gc.g.s);
        expect_close("ffn down dB", dgBd, gBd, gc.g.s);
        if (glu) {
            expect_close("ffn gate dA", dgAg, gAg, gc.g.s);
            expect_close("ffn gate dB", dgBg, gBg, gc.g.s);
        }
    }
}

BOOST_AUTO_TEST_SUITE_END()
