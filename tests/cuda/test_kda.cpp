// The KDA recurrence on the GPU against ops::kda_recurrent on random heads (q, k
// l2-normalised, decays g ≤ 0 up to strong ones, β in (0, 1), a nonzero starting state): the
// outputs and the carried state after a prefill-sized call, then after decode steps of one token;
// and the decay gate in both of its forms.
#include <cmath>
#include <cstdint>

#include <boost/test/unit_test.hpp>

#include "cuda_test.h"
#include "hymoe/backend/cuda_ops.h"
#include "hymoe/backend/ops.h"
#include "hymoe/model/kda.h"

namespace utf = boost::unit_test;
using namespace hymoe;
using namespace hymoe::cuda_test;

BOOST_AUTO_TEST_SUITE(cuda_kda, *utf::label("cuda"))

BOOST_AUTO_TEST_CASE(recurrent_matches_the_cpu_scan_across_calls, *utf::precondition(need_gpu)) {
    Gpu g;
    const int H = 3, K = 64, V = 48;
    Buffer S = random({H, K, V}, 90, DType::f32, 0.3f);
    Tensor dS = to_device(S.view(), DType::f32, g.arena, g.s);
    uint32_t stream = 91;
    for (int64_t T : {int64_t{9}, int64_t{1}, int64_t{1}}) {
        Buffer q = random({T, H, K}, stream++, DType::f32);
        Buffer k = random({T, H, K}, stream++, DType::f32);
        Buffer v = random({T, H, V}, stream++, DType::f32);
        Buffer gate = random({T, H, K}, stream++, DType::f32, 2.0f);
        Buffer beta = random({T, H}, stream++, DType::f32);
        ops::l2_norm_rows(q.ptr<float>(), T * H, K);
        ops::l2_norm_rows(k.ptr<float>(), T * H, K);
        for (int64_t i = 0; i < gate.view().numel(); ++i)  // g = −|N(0, 2)|: decays ≤ 0
            gate.ptr<float>()[i] = -std::abs(gate.ptr<float>()[i]);
        for (int64_t i = 0; i < beta.view().numel(); ++i)
            beta.ptr<float>()[i] = ops::sigmoid(beta.ptr<float>()[i]);
        Tensor dq = to_device(q.view(), DType::f32, g.arena, g.s);
        Tensor dk = to_device(k.view(), DType::f32, g.arena, g.s);
        Tensor dv = to_device(v.view(), DType::f32, g.arena, g.s);
        Tensor dg = to_device(gate.view(), DType::f32, g.arena, g.s);
        Tensor db = to_device(beta.view(), DType::f32, g.arena, g.s);
        Tensor dout = g.arena.tensor(DType::f32, {T, H, V});
        Buffer out(DType::f32, {T, H, V});

        model::KdaScanParams p;
        p.n_tok = T;
        p.n_head = H;
        p.d_k = K;
        p.d_v = V;
        model::KdaScanParams dp = p;
        p.q = q.ptr<float>();
        p.k = k.ptr<float>();
        p.v = v.ptr<float>();
        p.g = gate.ptr<float>();
        p.beta = beta.ptr<float>();
        p.S = S.ptr<float>();
        p.o = out.ptr<float>();
        dp.q = dq.ptr<float>();
        dp.k = dk.ptr<float>();
        dp.v = dv.ptr<float>();
        dp.g = dg.ptr<float>();
        dp.beta = db.ptr<float>();
        dp.S = dS.ptr<float>();
        dp.o = dout.ptr<float>();
        ops::kda_recurrent(p);
        cu::kda_recurrent(g.s, dp);

        Buffer got_o = to_host(dout, g.s), got_S = to_host(dS, g.s);
        const double err_o = rel_error(got_o.ptr<float>(), out.ptr<float>(), T * H * V);
        const double err_S = rel_error(got_S.ptr<float>(), S.ptr<float>(), int64_t{H} * K * V);
        BOOST_TEST_INFO("call of " << T << " tokens: o " << err_o << " S " << err_S);
        BOOST_TEST(err_o < tolerance(DType::f32));
        BOOST_TEST(err_S < tolerance(DType::f32));
    }
}

// model/kda.cpp's decay_gate (private there) written out: g = −e^{A_h}·softplus(f + dt_bias), or
// lb·σ(e^{A_h}(f + dt_bias)) with a lower bound; f spans large values (softplus's linear branch).
BOOST_AUTO_TEST_CASE(decay_gate_both_forms, *utf::precondition(need_gpu)) {
    Gpu g;
    const int64_t n_tok = 7, H = 4, K = 32, D = H * K;
    Buffer f = random({n_tok, D}, 95, DType::f32, 12.0f);
    Buffer a_log = random({H}, 96, DType::f32);
    Buffer dt = random({D}, 97, DType::f32);
    Tensor da = to_device(a_log.view(), DType::f32, g.arena, g.s);
    Tensor ddt = to_device(dt.view(), DType::f32, g.arena, g.s);
    for (bool lower : {false, true}) {
        const float lb = -5.0f;
        Buffer want(DType::f32, {n_tok, D});
        for (int64_t t = 0; t < n_tok; ++t)
            for (int64_t i = 0; i < D; ++i) {
                const float a = std::exp(a_log.ptr<float>()[i / K]);
                const float z = f.ptr<float>()[t * D + i] + dt.ptr<float>()[i];
                want.ptr<float>()[t * D + i] =
                    lower ? lb * ops::sigmoid(a * z) : -a * ops::softplus(z);
            }
        Tensor dg = to_device(f.view(), DType::f32, g.arena, g.s);
        cu::kda_decay_gate(g.s, dg, da, ddt, lower, lb);
        Buffer got = to_host(dg, g.s);
        const double err = rel_error(got.ptr<float>(), want.ptr<float>(), n_tok * D);
        BOOST_TEST_INFO((lower ? "lower bound" : "softplus") << ": normalised error " << err);
        BOOST_TEST(err < tolerance(DType::f32));
    }
}

BOOST_AUTO_TEST_SUITE_END()
