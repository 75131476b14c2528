// The fused KDA kernels (hymoe/backend/cuda_fused.h) against ops::kda_recurrent: the chunked
// prefill on a batch of sequences of 0, 1, 63, 64, 65 and 150 tokens (partial chunks on both
// sides of a boundary), each continuing its own nonzero state from a permuted pool slot, for
// K = 64 and 128, V = 96 (32-column blocks) and 128 (64-column blocks), q/k/v stored f32 and
// bf16; decays g = −|N(0, 2)| (strong: e^{Γ} underflows within a chunk); then decode steps on
// the states the prefill left. The prefill's chunk products take bf16 operands, so its outputs
// and states are held to the bf16 tolerance whatever the storage (the numpy emulation of its
// tiling in fp32 arithmetic with bf16 operands gives 2e-3 to 4e-3); the decode step computes in
// fp32 and is held to the storage's tolerance.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "cuda_test.h"
#include "hymoe/backend/cuda_fused.h"
#include "hymoe/backend/ops.h"
#include "hymoe/model/kda.h"

namespace utf = boost::unit_test;
using namespace hymoe;
using namespace hymoe::cuda_test;

namespace {

// The recurrence's inputs for T tokens: q, k l2-normalised (q also scaled by K^{-1/2}) and then
// rounded to the storage dtype, g ≤ 0, β ∈ (0, 1).
struct Inputs {
    Buffer q, k, v, g, beta;  // [T, H, K] ×2, [T, H, V], [T, H, K], [T, H]
};

Inputs make_inputs(int64_t T, int H, int K, int V, uint32_t stream, DType t) {
    Inputs in{random({T, H, K}, stream, DType::f32),
              random({T, H, K}, stream + 1, DType::f32),
              random({T, H, V}, stream + 2, t),
              random({T, H, K}, stream + 3, DType::f32, 2.0f),
              random({T, H}, stream + 4, DType::f32)};
    ops::l2_norm_rows(in.q.ptr<float>(), T * H, K);
    ops::l2_norm_rows(in.k.ptr<float>(), T * H, K);
    const float scale = 1.0f / std::sqrt(static_cast<float>(K));
    for (int64_t i = 0; i < T * H * K; ++i) {
        in.q.ptr<float>()[i] *= scale;
        in.g.ptr<float>()[i] = -std::abs(in.g.ptr<float>()[i]);
    }
    for (int64_t i = 0; i < T * H; ++i)
        in.beta.ptr<float>()[i] = ops::sigmoid(in.beta.ptr<float>()[i]);
    round_to(in.q, t);
    round_to(in.k, t);
    return in;
}

// The device copies, and the params over them (states and outputs set by the caller).
struct DeviceInputs {
    Tensor q, k, v, g, beta;
};

DeviceInputs upload(const Inputs& in, DType t, Gpu& g) {
    return {to_device(in.q.view(), t, g.arena, g.s),
            to_device(in.k.view(), t, g.arena, g.s),
            to_device(in.v.view(), t, g.arena, g.s),
            to_device(in.g.view(), DType::f32, g.arena, g.s),
            to_device(in.beta.view(), DType::f32, g.arena, g.s)};
}

cu::KdaBatchParams params_of(const DeviceInputs& d, int n_seq, int H, int K, int V, DType t) {
    cu::KdaBatchParams p;
    p.n_seq = n_seq;
    p.n_head = H;
    p.d_k = K;
    p.d_v = V;
    p.dtype = t;
    p.q = d.q.data;
    p.k = d.k.data;
    p.v = d.v.data;
    p.g = d.g.ptr<float>();
    p.beta = d.beta.ptr<float>();
    return p;
}

// ops::kda_recurrent on rows [first, first + T) of `in`, continuing S [H, K, V]; o [T, H, V].
void cpu_scan(const Inputs& in, int64_t first, int64_t T, int H, int K, int V, float* S, float* o) {
    model::KdaScanParams p;
    p.n_tok = T;
    p.n_head = H;
    p.d_k = K;
    p.d_v = V;
    p.q = in.q.ptr<float>() + first * H * K;
    p.k = in.k.ptr<float>() + first * H * K;
    p.v = in.v.ptr<float>() + first * H * V;
    p.g = in.g.ptr<float>() + first * H * K;
    p.beta = in.beta.ptr<float>() + first * H;
    p.S = S;
    p.o = o;
    ops::kda_recurrent(p);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(cuda_fused_kda, *utf::label("cuda"))

BOOST_AUTO_TEST_CASE(chunked_prefill_then_decode_match_the_scan, *utf::precondition(need_gpu)) {
    Gpu g;
    const int H = 3;
    const std::vector<int64_t> lengths = {65, 0, 150, 1, 64, 63};
    const int B = static_cast<int>(lengths.size());
    std::vector<int64_t> start(B + 1, 0);
    for (int b = 0; b < B; ++b)
        start[b + 1] = start[b] + lengths[b];
    const int64_t n_tok = start[B];
    std::vector<int32_t> slot(B);  // sequence b in slot B − b (slot 0 unused)
    for (int b = 0; b < B; ++b)
        slot[b] = B - b;
    uint32_t stream = 300;
    for (DType t : {DType::f32, DType::bf16})
        for (auto [K, V] : {std::array<int, 2>{64, 96}, {128, 128}}) {
            const Inputs in = make_inputs(n_tok, H, K, V, stream, t);
            stream += 10;
            const int64_t state = int64_t{H} * K * V;
            Buffer pool = random({B + 1, H, K, V}, stream++, DType::f32, 0.3f);
            Buffer want_pool = random({B + 1, H, K, V}, stream - 1, DType::f32, 0.3f);
            Buffer want_o(DType::f32, {n_tok, H, V});
            for (int b = 0; b < B; ++b)
                cpu_scan(in,
                         start[b],
                         lengths[b],
                         H,
                         K,
                         V,
                         want_pool.ptr<float>() + slot[b] * state,
                         want_o.ptr<float>() + start[b] * H * V);

            DeviceInputs d = upload(in, t, g);
            Tensor dpool = to_device(pool.view(), DType::f32, g.arena, g.s);
            Tensor dout = g.arena.tensor(t, {n_tok, H, V});
            Tensor dstart = to_device_i64(start, g.arena, g.s);
            Tensor dslot = to_device_i32(slot, g.arena, g.s);
            cu::KdaBatchParams p = params_of(d, B, H, K, V, t);
            p.seq_start = dstart.ptr<int64_t>();
            p.state_slot = dslot.ptr<int32_t>();
            p.S = dpool.ptr<float>();
            p.o = dout.data;
            cu::kda_chunk_prefill(g.s, p);
            Buffer got_o = to_host(dout, g.s), got_pool = to_host(dpool, g.s);
            const double err_o = rel_error(got_o.ptr<float>(), want_o.ptr<float>(), n_tok * H * V);
            const double err_S =
                rel_error(got_pool.ptr<float>(), want_pool.ptr<float>(), (B + 1) * state);
            BOOST_TEST_INFO("prefill " << to_string(t) << " K " << K << " V " << V << ": o "
                                       << err_o << " S " << err_S);
            BOOST_TEST(err_o < tolerance(DType::bf16));
            BOOST_TEST(err_S < tolerance(DType::bf16));

            // Three decode steps of every sequence, from the states the prefill left (the CPU
            // continues from the GPU's states, so only the step's own error is measured).
            std::copy(got_pool.ptr<float>(),
                      got_pool.ptr<float>() + (B + 1) * state,
                      want_pool.ptr<float>());
            for (int step = 0; step < 3; ++step) {
                const Inputs tok = make_inputs(B, H, K, V, stream, t);
                stream += 10;
                Buffer want_step(DType::f32, {B, H, V});
                for (int b = 0; b < B; ++b)
                    cpu_scan(tok,
                             b,
                             1,
                             H,
                             K,
                             V,
                             want_pool.ptr<float>() + slot[b] * state,
                             want_step.ptr<float>() + int64_t{b} * H * V);
                DeviceInputs dt = upload(tok, t, g);
                Tensor dstep = g.arena.tensor(t, {B, H, V});
                cu::KdaBatchParams q = params_of(dt, B, H, K, V, t);
                q.state_slot = dslot.ptr<int32_t>();
                q.S = dpool.ptr<float>();
                q.o = dstep.data;
                cu::kda_decode_step(g.s, q);
                Buffer got_step = to_host(dstep, g.s), got_S = to_host(dpool, g.s);
                const double e_o =
                    rel_error(got_step.ptr<float>(), want_step.ptr<float>(), int64_t{B} * H * V);
                const double e_S =
                    rel_error(got_S.ptr<float>(), want_pool.ptr<float>(), (B + 1) * state);
                BOOST_TEST_INFO("decode step " << step << " " << to_string(t) << " K " << K
                                               << ": o " << e_o << " S " << e_S);
                BOOST_TEST(e_o < tolerance(t));
                BOOST_TEST(e_S < tolerance(DType::f32));
                std::copy(got_S.ptr<float>(),
                          got_S.ptr<float>() + (B + 1) * state,
                          want_pool.ptr<float>());
                for (Tensor* x : {&dt.q, &dt.k, &dt.v, &dt.g, &dt.beta, &dstep})
                    g.arena.free(x->data);
            }
            for (Tensor* x : {&d.q, &d.k, &d.v, &d.g, &d.beta, &dpool, &dout, &dstart, &dslot})
                g.arena.free(x->data);
        }
}

BOOST_AUTO_TEST_SUITE_END()
