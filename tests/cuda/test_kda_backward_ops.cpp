// The KDA backward's pieces (hymoe/backend/ops_kda_backward.h) on a CUDA context against the same
// ops on the CPU context, fp32: kda_silu_l2 and its backward (q's l2 + scale, v's SiLU only), the
// decay gate with its derivative (both forms), the output's gated RMSNorm backward, the causal
// conv's backward over three packed sequences (one shorter than the kernel), σ's backward, and
// one sequence's scan checkpoints and recurrence backward (ops::kda_chunked_checkpoints,
// kda_scan_backward).
// The CPU forms are tests/unit/backend/test_kda_backward_ops.cpp's.
#include <cstdint>
#include <optional>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "cuda_test.h"
#include "hymoe/backend/cuda_gemm.h"
#include "hymoe/backend/ops.h"
#include "hymoe/backend/ops_kda_backward.h"

namespace utf = boost::unit_test;
using namespace hymoe;
using namespace hymoe::cuda_test;

BOOST_AUTO_TEST_SUITE(cuda_kda_backward_ops, *utf::label("cuda"))

BOOST_AUTO_TEST_CASE(activations_and_gates, *utf::precondition(need_gpu)) {
    GpuCtx gc;
    const backend::Ctx cpu = backend::cpu_ctx();
    const DType f = DType::f32;
    const int64_t n = 13, H = 4, K = 32, D = H * K;
    const Buffer c = random({n, D}, 1, f), dy = random({n, D}, 2, f);
    for (bool l2 : {true, false}) {
        const float scale = l2 ? 0.177f : 1.0f;
        Buffer y(f, {n, D}), g = random({n, D}, 2, f);
        Tensor y_dev = gc.g.arena.tensor(f, {n, D}), dg = gc.up(dy);
        ops::kda_silu_l2(cpu, c.view(), K, l2, scale, y.view());
        ops::kda_silu_l2(gc.ctx, gc.up(c), K, l2, scale, y_dev);
        expect_close("kda_silu_l2", y_dev, y, gc.g.s);
        ops::kda_silu_l2_backward(cpu, c.view(), K, l2, scale, g.view());
        ops::kda_silu_l2_backward(gc.ctx, gc.up(c), K, l2, scale, dg);
        expect_close("kda_silu_l2_backward", dg, g, gc.g.s);
    }

    const Buffer a_log = random({H}, 3, f, 0.5f), bias = random({D}, 4, f);
    for (std::optional<float> lb : {std::optional<float>{}, std::optional<float>{-5.0f}}) {
        Buffer g = random({n, D}, 5, f, 3.0f), dz(f, {n, D});
        Tensor dgate = gc.up(g), ddz = gc.g.arena.tensor(f, {n, D});
        ops::kda_decay_gate_grad(cpu, g.view(), a_log.view(), bias.view(), lb, dz.view());
        ops::kda_decay_gate_grad(gc.ctx, dgate, gc.up(a_log), gc.up(bias), lb, ddz);
        expect_close("kda_decay_gate_grad g", dgate, g, gc.g.s);
        expect_close("kda_decay_gate_grad dg_dz", ddz, dz, gc.g.s);
    }

    Buffer o = random({n, D}, 6, f), w = random({K}, 7, f), nrm = random({n, D}, 8, f),
           gate = random({n, D}, 9, f), don = random({n, D}, 10, f);
    ops::sigmoid_inplace(gate.view());
    Buffer dO(f, {n, D}), dz(f, {n, D});
    Tensor ddO = gc.g.arena.tensor(f, {n, D}), ddz = gc.g.arena.tensor(f, {n, D});
    ops::kda_gated_norm_backward(
        cpu, o.view(), nrm.view(), gate.view(), w.view(), 1e-5f, don.view(), dO.view(), dz.view());
    ops::kda_gated_norm_backward(
        gc.ctx, gc.up(o), gc.up(nrm), gc.up(gate), gc.up(w), 1e-5f, gc.up(don), ddO, ddz);
    expect_close("kda_gated_norm_backward dO", ddO, dO, gc.g.s);
    expect_close("kda_gated_norm_backward dgate", ddz, dz, gc.g.s);

    Buffer d = random({n, D}, 10, f);  // don
    Tensor dd = gc.up(don);
    ops::sigmoid_backward(cpu, gate.view(), d.view());
    ops::sigmoid_backward(gc.ctx, gc.up(gate), dd);
    expect_close("sigmoid_backward", dd, d, gc.g.s);
}

BOOST_AUTO_TEST_CASE(conv_backward_over_sequences, *utf::precondition(need_gpu)) {
    GpuCtx gc;
    const DType f = DType::f32;
    const int64_t D = 96, W = 4;
    const std::vector<int64_t> offsets{0, 9, 11, 20};
    const std::vector<int32_t> row_seq{0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 2};
    const int64_t n = offsets.back();
    ops::KdaSeqTable t;
    t.n_tok = n;
    t.n_seq = 3;
    t.max_len = 9;
    t.offsets = offsets.data();
    const Buffer w = random({D, 1, W}, 20, f), dc = random({n, D}, 21, f);
    Buffer du(f, {n, D});
    ops::causal_conv_backward(backend::cpu_ctx(), t, dc.view(), w.view(), du.view());
    const Tensor doff = to_device_i64(offsets, gc.g.arena, gc.g.s),
                 drs = to_device_i32(row_seq, gc.g.arena, gc.g.s);
    ops::KdaSeqTable dt = t;
    dt.offsets = doff.ptr<int64_t>();
    dt.row_seq = drs.ptr<int32_t>();
    Tensor ddu = gc.g.arena.tensor(f, {n, D});
    ops::causal_conv_backward(gc.ctx, dt, gc.up(dc), gc.up(w), ddu);
    expect_close("causal_conv_backward", ddu, du, gc.g.s);
}

// One sequence of 37 tokens in chunks of 16 from a nonzero state, K ≠ V: the checkpoints, output
// and final state of kda_chunked_checkpoints, and every gradient of kda_scan_backward.
BOOST_AUTO_TEST_CASE(scan_checkpoints_and_backward, *utf::precondition(need_gpu)) {
    GpuCtx gc;
    const backend::Ctx cpu = backend::cpu_ctx();
    const DType f = DType::f32;
    const int64_t T = 37, H = 2, K = 32, V = 24;
    const int chunk = 16;
    const int64_t n_ck = (T + chunk - 1) / chunk;
    Buffer q = random({T * H, K}, 30, f), k = random({T * H, K}, 31, f),
           v = random({T, H * V}, 32, f), g = random({T, H * K}, 33, f),
           beta = random({T, H}, 34, f), S = random({H, K, V}, 35, f, 0.3f),
           dO = random({T, H * V}, 36, f);
    ops::l2_norm_rows(q.ptr<float>(), T * H, K);
    ops::l2_norm_rows(k.ptr<float>(), T * H, K);
    for (int64_t i = 0; i < T * H * K; ++i)
        g.ptr<float>()[i] = -0.5f * ops::softplus(g.ptr<float>()[i]);
    ops::sigmoid_inplace(beta.view());
    Tensor dq_in = gc.up(q), dk_in = gc.up(k), dv_in = gc.up(v), dg_in = gc.up(g),
           db_in = gc.up(beta), dS = gc.up(S), ddO = gc.up(dO);

    Buffer o(f, {T, H * V}), ckpt(f, {n_ck, H, K, V});
    Tensor d_o = gc.g.arena.tensor(f, {T, H * V}), d_ckpt = gc.g.arena.tensor(f, {n_ck, H, K, V});
    ops::KdaScanParams p{T,
                         static_cast<int>(H),
                         static_cast<int>(K),
                         static_cast<int>(V),
                         q.ptr<float>(),
                         k.ptr<float>(),
                         v.ptr<float>(),
                         g.ptr<float>(),
                         beta.ptr<float>(),
                         S.ptr<float>(),
                         o.ptr<float>()};
    ops::KdaScanParams dp{T,
                          static_cast<int>(H),
                          static_cast<int>(K),
                          static_cast<int>(V),
                          dq_in.ptr<float>(),
                          dk_in.ptr<float>(),
                          dv_in.ptr<float>(),
                          dg_in.ptr<float>(),
                          db_in.ptr<float>(),
                          dS.ptr<float>(),
                          d_o.ptr<float>()};
    ops::kda_chunked_checkpoints(cpu, p, ckpt.ptr<float>(), chunk);
    ops::kda_chunked_checkpoints(gc.ctx, dp, d_ckpt.ptr<float>(), chunk);
    expect_close("kda_chunked_checkpoints o", d_o, o, gc.g.s);
    expect_close("kda_chunked_checkpoints S", dS, S, gc.g.s);
    expect_close("kda_chunked_checkpoints ckpt", d_ckpt, ckpt, gc.g.s);

    Buffer gq(f, {T * H, K}), gk(f, {T * H, K}), gv(f, {T, H * V}), gg(f, {T, H * K}),
        gb(f, {T, H});
    Tensor hq = gc.g.arena.tensor(f, {T * H, K}), hk = gc.g.arena.tensor(f, {T * H, K}),
           hv = gc.g.arena.tensor(f, {T, H * V}), hg = gc.g.arena.tensor(f, {T, H * K}),
           hb = gc.g.arena.tensor(f, {T, H});
    ops::kda_scan_backward(cpu,
                           p,
                           ckpt.ptr<float>(),
                           {dO.ptr<float>(),
                            gq.ptr<float>(),
                            gk.ptr<float>(),
                            gv.ptr<float>(),
                            gg.ptr<float>(),
                            gb.ptr<float>()},
                           chunk);
    ops::kda_scan_backward(gc.ctx,
                           dp,
                           d_ckpt.ptr<float>(),
                           {ddO.ptr<float>(),
                            hq.ptr<float>(),
                            hk.ptr<float>(),
                            hv.ptr<float>(),
                            hg.ptr<float>(),
                            hb.ptr<float>()},
                           chunk);
    expect_close("kda_scan_backward dq", hq, gq, gc.g.s);
    expect_close("kda_scan_backward dk", hk, gk, gc.g.s);
    expect_close("kda_scan_backward dv", hv, gv, gc.g.s);
    expect_close("kda_scan_backward dg", hg, gg, gc.g.s);
    expect_close("kda_scan_backward dbeta", hb, gb, gc.g.s);
}

BOOST_AUTO_TEST_SUITE_END()
