// The ops on a Ctx (hymoe/backend/ops.h, backend/ctx.h) on the CPU: each equals the CPU op it
// dispatches to bit for bit (a miswired switch fails), ReLU² by hand, a tensor on the wrong device
// and an incomplete or unbuilt CUDA context refused with the op's name, and Scratch tensors. The
// KDA scans on a CPU context equal the CPU scans bit for bit; the ones without a CUDA kernel
// (checkpoints, backward) refuse a CUDA context. The KDA block's elementwise ops (ops_kda.h): the
// decay gate in both forms against its formula, the others bit-identical to their CPU forms.
// The MLA/DSA block's ops (ops_attention.h): RoPE over strided heads bit-identical to the raw
// CPU rope, the column slice and the host copy element by element, the LayerNorm, the attention
// core and the indexer's scores and mask bit-identical.
// The same ops on a CUDA context against these are tests/cuda/test_ctx_ops.cpp.
#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "hymoe/backend/ops.h"
#include "hymoe/backend/ops_attention.h"
#include "hymoe/backend/ops_kda.h"
#include "hymoe/core/error.h"
#include "hymoe/core/rng.h"

using namespace hymoe;

namespace {

Buffer random(Shape shape, uint32_t stream) {
    Buffer b(DType::f32, std::move(shape));
    Philox rng(7, stream, 0);
    rng.fill_normal(b.ptr<float>(), static_cast<size_t>(b.view().numel()), 0.0f, 1.0f);
    return b;
}

Buffer copy_of(const Buffer& b) {
    Buffer c(b.view().dtype, b.view().shape);
    std::memcpy(c.view().data, b.view().data, b.view().bytes());
    return c;
}

bool same_bits(const Buffer& a, const Buffer& b) {
    return a.view().bytes() == b.view().bytes() &&
           std::memcmp(a.view().data, b.view().data, a.view().bytes()) == 0;
}

// An Error whose message contains `part`.
auto says(const std::string& part) {
    return [part](const Error& e) { return std::string(e.what()).find(part) != std::string::npos; };
}

}  // namespace

BOOST_AUTO_TEST_SUITE(ctx_ops)

BOOST_AUTO_TEST_CASE(cpu_context_is_the_cpu_op_bit_for_bit) {
    const backend::Ctx ctx = backend::cpu_ctx();
    const Buffer x = random({5, 24}, 1), w = random({16, 24}, 2), g = random({24}, 3);
    Buffer y1(DType::f32, {5, 16}), y2(DType::f32, {5, 16});
    ops::linear(x.view(), w.view(), y1.view());
    ops::linear(ctx, x.view(), w.view(), y2.view());
    BOOST_TEST(same_bits(y1, y2));

    Buffer n1(DType::f32, {5, 24}), n2(DType::f32, {5, 24});
    ops::rms_norm(x.view(), g.view(), 1e-6f, n1.view());
    ops::rms_norm(ctx, x.view(), g.view(), 1e-6f, n2.view());
    BOOST_TEST(same_bits(n1, n2));

    Buffer a1 = copy_of(x), a2 = copy_of(x);
    ops::silu_inplace(a1.view());
    ops::silu_inplace(ctx, a2.view());
    BOOST_TEST(same_bits(a1, a2));
    ops::sigmoid_inplace(a1.view());
    ops::sigmoid_inplace(ctx, a2.view());
    BOOST_TEST(same_bits(a1, a2));
    ops::add_inplace(a1.view(), x.view());
    ops::add_inplace(ctx, a2.view(), x.view());
    BOOST_TEST(same_bits(a1, a2));

    const Buffer up = random({5, 24}, 4);
    Buffer s1(DType::f32, {5, 24}), s2(DType::f32, {5, 24});
    ops::swiglu(x.view(), up.view(), s1.view());
    ops::swiglu(ctx, x.view(), up.view(), s2.view());
    BOOST_TEST(same_bits(s1, s2));

    Buffer m1 = copy_of(x), m2 = copy_of(x);
    m1.ptr<float>()[3] = m2.ptr<float>()[3] = -INFINITY;
    ops::softmax_rows(m1.ptr<float>(), 5, 24);
    ops::softmax_rows(ctx, m2.view());
    BOOST_TEST(same_bits(m1, m2));

    const Buffer u = random({7, 6}, 5), cw = random({6, 4}, 6);
    Buffer t1(DType::f32, {3, 6}), t2(DType::f32, {3, 6});
    Buffer c1(DType::f32, {7, 6}), c2(DType::f32, {7, 6});
    for (int call = 0; call < 2; ++call) {  // the second call continues through the tail
        ops::causal_conv(u.view(), cw.view(), t1.view(), c1.view());
        ops::causal_conv(ctx, u.view(), cw.view(), t2.view(), c2.view());
        BOOST_TEST(same_bits(c1, c2));
        BOOST_TEST(same_bits(t1, t2));
    }

    Buffer idx(DType::i64, {5, 3});
    ops::top_k_rows(ctx, x.view(), 3, idx.view());
    for (int64_t r = 0; r < 5; ++r) {
        std::vector<int64_t> want(3);
        ops::top_k(x.ptr<float>() + r * 24, 24, 3, want.data());
        for (int64_t j = 0; j < 3; ++j)
            BOOST_TEST(idx.ptr<int64_t>()[r * 3 + j] == want[static_cast<size_t>(j)]);
    }
}

BOOST_AUTO_TEST_CASE(relu2_by_hand) {
    Buffer x(DType::f32, {4});
    const float in[] = {-2.0f, 0.0f, 0.5f, 3.0f}, want[] = {0.0f, 0.0f, 0.25f, 9.0f};
    std::copy(in, in + 4, x.ptr<float>());
    ops::relu2_inplace(backend::cpu_ctx(), x.view());
    for (int i = 0; i < 4; ++i)
        BOOST_TEST(x.ptr<float>()[i] == want[i]);
}

BOOST_AUTO_TEST_CASE(wrong_device_and_context_refused) {
    Buffer x = random({2, 8}, 8), y(DType::f32, {2, 8});
    Tensor on_gpu = y.view();
    on_gpu.device = Device::cuda;  // a view claiming to be device memory
    BOOST_CHECK_EXCEPTION(ops::add_inplace(backend::cpu_ctx(), on_gpu, x.view()),
                          Error,
                          says("add_inplace: a cuda tensor on a cpu context"));
    backend::Ctx gpu;
    gpu.device = Device::cuda;
#ifdef HYMOE_CUDA
    BOOST_CHECK_EXCEPTION(ops::silu_inplace(gpu, on_gpu),
                          Error,
                          says("silu_inplace: a CUDA context without its stream"));
#else
    BOOST_CHECK_EXCEPTION(ops::silu_inplace(gpu, on_gpu),
                          Error,
                          says("silu_inplace: a CUDA context in a build without CUDA"));
#endif
    Buffer idx32(DType::i32, {2, 3});
    BOOST_CHECK_EXCEPTION(ops::top_k_rows(backend::cpu_ctx(), x.view(), 3, idx32.view()),
                          Error,
                          says("top_k_rows: idx [2, 3] (i32)"));
}

// One sequence of 21 tokens (two chunks of 16), H = 2, K = 8, V = 4, from a random state: o and S
// of each scan, the checkpoints and every gradient of the backward.
BOOST_AUTO_TEST_CASE(kda_scans_on_cpu_context_bit_for_bit) {
    const int64_t T = 21, H = 2, K = 8, V = 4;
    Buffer q = random({T, H, K}, 20), k = random({T, H, K}, 21), v = random({T, H, V}, 22);
    Buffer g = random({T, H, K}, 23), beta = random({T, H}, 24), S0 = random({H, K, V}, 25);
    Buffer dO = random({T, H, V}, 26);
    for (int64_t i = 0; i < T * H * K; ++i)
        g.ptr<float>()[i] = -std::abs(g.ptr<float>()[i]);
    for (int64_t i = 0; i < T * H; ++i)
        beta.ptr<float>()[i] = 1.0f / (1.0f + std::exp(-beta.ptr<float>()[i]));
    struct Run {
        Buffer S, o, ckpt, dq, dk, dv, dg, dbeta;
    };
    auto run = [&](bool on_ctx) {
        Run r{copy_of(S0),
              Buffer(DType::f32, {T, H, V}),
              Buffer(DType::f32, {2, H, K, V}),
              Buffer(DType::f32, {T, H, K}),
              Buffer(DType::f32, {T, H, K}),
              Buffer(DType::f32, {T, H, V}),
              Buffer(DType::f32, {T, H, K}),
              Buffer(DType::f32, {T, H})};
        ops::KdaScanParams p{T,
                             H,
                             K,
                             V,
                             q.ptr<float>(),
                             k.ptr<float>(),
                             v.ptr<float>(),
                             g.ptr<float>(),
                             beta.ptr<float>(),
                             r.S.ptr<float>(),
                             r.o.ptr<float>()};
        const ops::KdaScanGrads d{dO.ptr<float>(),
                                  r.dq.ptr<float>(),
                                  r.dk.ptr<float>(),
                                  r.dv.ptr<float>(),
                                  r.dg.ptr<float>(),
                                  r.dbeta.ptr<float>()};
        const backend::Ctx cpu = backend::cpu_ctx();
        if (on_ctx) {
            ops::kda_recurrent(cpu, p);
            ops::kda_chunked(cpu, p, 16);
            ops::kda_chunked_checkpoints(cpu, p, r.ckpt.ptr<float>(), 16);
            ops::kda_scan_backward(cpu, p, r.ckpt.ptr<float>(), d, 16);
        } else {
            ops::kda_recurrent(p);
            ops::kda_chunked(p, 16);
            ops::kda_chunked_checkpoints(p, r.ckpt.ptr<float>(), 16);
            ops::kda_scan_backward(p, r.ckpt.ptr<float>(), d, 16);
        }
        return r;
    };
    const Run a = run(true), b = run(false);
    BOOST_TEST(same_bits(a.S, b.S));
    BOOST_TEST(same_bits(a.o, b.o));
    BOOST_TEST(same_bits(a.ckpt, b.ckpt));
    BOOST_TEST(same_bits(a.dq, b.dq));
    BOOST_TEST(same_bits(a.dk, b.dk));
    BOOST_TEST(same_bits(a.dv, b.dv));
    BOOST_TEST(same_bits(a.dg, b.dg));
    BOOST_TEST(same_bits(a.dbeta, b.dbeta));

    backend::Ctx gpu;
    gpu.device = Device::cuda;
    ops::KdaScanParams p;
#ifdef HYMOE_CUDA  // a context that passes the completeness check (never dereferenced)
    static char fake[3];
    gpu.stream = reinterpret_cast<const backend::cuda::Stream*>(&fake[0]);
    gpu.arena = reinterpret_cast<backend::cuda::DeviceArena*>(&fake[1]);
    gpu.blas = reinterpret_cast<backend::cuda::Blas*>(&fake[2]);
    BOOST_CHECK_EXCEPTION(ops::kda_chunked_checkpoints(gpu, p, nullptr),
                          Error,
                          says("kda_chunked_checkpoints: no CUDA kernel for one sequence"));
    BOOST_CHECK_EXCEPTION(ops::kda_scan_backward(gpu, p, nullptr, {}),
                          Error,
                          says("kda_scan_backward: no CUDA kernel for one sequence"));
#else
    BOOST_CHECK_EXCEPTION(
        ops::kda_chunked(gpu, p), Error, says("kda_chunked: a CUDA context in a build without"));
    BOOST_CHECK_EXCEPTION(ops::kda_scan_backward(gpu, p, nullptr, {}),
                          Error,
                          says("kda_scan_backward: a CUDA context in a build without"));
#endif
}

// The decay gate, g = −e^{A_h}·softplus(f + dt_bias) or lb·σ(e^{A_h}(f + dt_bias)), by hand from
// logits wide enough to reach softplus's linear branch; the l2 norm on a CPU context bit-identical
// to the CPU form, scaling and product by hand; a CUDA tensor refused with the op's name.
BOOST_AUTO_TEST_CASE(kda_elementwise_ops) {
    const backend::Ctx ctx = backend::cpu_ctx();
    const int64_t n_tok = 3, H = 2, K = 4, D = H * K;
    const Buffer f = random({n_tok, D}, 30), a_log = random({1, 1, H, 1}, 31), dt = random({D}, 32);
    for (float* p = f.ptr<float>(); p < f.ptr<float>() + n_tok * D; ++p)
        *p *= 12.0f;
    for (std::optional<float> lb : {std::optional<float>{}, std::optional<float>{-5.0f}}) {
        Buffer g = copy_of(f);
        ops::kda_decay_gate(ctx, g.view(), a_log.view(), dt.view(), lb);
        for (int64_t t = 0; t < n_tok; ++t)
            for (int64_t i = 0; i < D; ++i) {
                const float a = std::exp(a_log.ptr<float>()[i / K]);
                const float z = f.ptr<float>()[t * D + i] + dt.ptr<float>()[i];
                const float want = lb ? *lb * ops::sigmoid(a * z) : -a * ops::softplus(z);
                BOOST_TEST(g.ptr<float>()[t * D + i] == want);
            }
    }

    const Buffer x = random({6, 8}, 33), y = random({6, 8}, 34);
    Buffer a = copy_of(x), b = copy_of(x);
    ops::l2_norm_rows(a.ptr<float>(), 6, 8);
    ops::l2_norm_rows(ctx, b.view());
    BOOST_TEST(same_bits(a, b));
    const Buffer normed = copy_of(a);
    ops::scale_inplace(a.view(), 0.25f);
    ops::scale_inplace(ctx, b.view(), 0.25f);
    BOOST_TEST(same_bits(a, b));
    for (int64_t i = 0; i < 48; ++i)
        BOOST_TEST(a.ptr<float>()[i] == normed.ptr<float>()[i] * 0.25f);
    Buffer c = copy_of(x);
    ops::mul_inplace(ctx, c.view(), y.view());
    for (int64_t i = 0; i < 48; ++i)
        BOOST_TEST(c.ptr<float>()[i] == x.ptr<float>()[i] * y.ptr<float>()[i]);

    Tensor on_gpu = y.view();
    on_gpu.device = Device::cuda;
    BOOST_CHECK_EXCEPTION(ops::mul_inplace(ctx, c.view(), on_gpu),
                          Error,
                          says("mul_inplace: a cuda tensor on a cpu context"));
    BOOST_CHECK_EXCEPTION(ops::kda_decay_gate(ctx, on_gpu, a_log.view(), dt.view(), {}),
                          Error,
                          says("kda_decay_gate: a cuda tensor on a cpu context"));
}

BOOST_AUTO_TEST_CASE(attention_ops) {
    const backend::Ctx ctx = backend::cpu_ctx();
    const Buffer x = random({5, 40}, 20);  // 2 heads of 16 from column 4, 8 rotated dims each
    std::vector<int64_t> pos = {0, 3, 1, 9, 2};
    const Tensor pos_t{pos.data(), DType::i64, Device::cpu, {5}};
    const ops::RopeFreqs freqs = ops::rope_freqs(8, 10000.0);
    for (const bool interleaved : {true, false}) {
        Buffer a = copy_of(x), b = copy_of(x);
        ops::rope(a.ptr<float>() + 4, 5, 2, 40, 16, pos.data(), freqs, interleaved);
        ops::rope(ctx, b.view(), 4, 2, 16, pos_t, freqs, interleaved);
        BOOST_TEST(same_bits(a, b));
        BOOST_TEST(!same_bits(a, x));
    }
    Buffer b = copy_of(x);
    BOOST_CHECK_EXCEPTION(
        ops::rope(ctx, b.view(), 30, 2, 16, pos_t, freqs, true), Error, says("rope: x [5, 40]"));

    Buffer cols(DType::f32, {5, 7});
    ops::copy_cols(ctx, x.view(), 33, cols.view());
    for (int64_t r = 0; r < 5; ++r)
        for (int64_t c = 0; c < 7; ++c)
            BOOST_TEST(cols.ptr<float>()[r * 7 + c] == x.ptr<float>()[r * 40 + 33 + c]);
    BOOST_CHECK_EXCEPTION(
        ops::copy_cols(ctx, x.view(), 34, cols.view()), Error, says("copy_cols: columns [34, 41)"));

    const Buffer w = random({40}, 21), bias = random({40}, 22);
    Buffer ln_a(DType::f32, {5, 40}), ln_b(DType::f32, {5, 40});
    ops::layer_norm(x.view(), w.view(), bias.view(), 1e-6f, ln_a.view());
    ops::layer_norm(ctx, x.view(), w.view(), bias.view(), 1e-6f, ln_b.view());
    BOOST_TEST(same_bits(ln_a, ln_b));

    Buffer up(DType::f32, {5, 40});
    ops::upload(ctx, x.view(), up.view());
    BOOST_TEST(same_bits(up, x));

    // attention_core, the indexer's scores and mask: the CPU forms bit for bit
    const Buffer q = random({4, 16}, 23), k = random({6, 16}, 24), v = random({6, 8}, 25);
    Buffer mask(DType::f32, {4, 6});
    for (int64_t i = 0; i < 4; ++i)
        for (int64_t u = 0; u < 6; ++u)
            mask.ptr<float>()[i * 6 + u] = u <= i + 2 ? 0.0f : -INFINITY;
    Buffer o_a(DType::f32, {4, 8}), o_b(DType::f32, {4, 8});
    ops::attention_core(q.view(), k.view(), v.view(), mask.view(), 0.25f, o_a.view());
    ops::attention_core(ctx, q.view(), k.view(), v.view(), mask.view(), 0.25f, o_b.view());
    BOOST_TEST(same_bits(o_a, o_b));
    const Buffer wq = random({4, 2}, 26), keys = random({6, 8}, 27);  // 2 heads of 8
    Buffer s_a(DType::f32, {4, 6}), s_b(DType::f32, {4, 6});
    ops::indexer_scores(q.view(), wq.view(), keys.view(), s_a.view());
    ops::indexer_scores(ctx, q.view(), wq.view(), keys.view(), s_b.view());
    BOOST_TEST(same_bits(s_a, s_b));
    Buffer m_a(DType::f32, {4, 6}), m_b(DType::f32, {4, 6});
    ops::indexer_mask(s_a.view(), 2, 2, m_a.view());
    ops::indexer_mask(ctx, s_a.view(), 2, 2, m_b.view());
    BOOST_TEST(same_bits(m_a, m_b));
}

BOOST_AUTO_TEST_CASE(scratch_tensors_live_to_the_scope_end) {
    const backend::Ctx ctx = backend::cpu_ctx();
    backend::Scratch scratch(ctx);
    Tensor a = scratch(DType::f32, {3, 4});
    Tensor b = scratch(DType::i64, {5});
    BOOST_TEST((a.device == Device::cpu));
    BOOST_TEST((a.shape == Shape{3, 4}));
    BOOST_TEST((b.dtype == DType::i64));
    BOOST_TEST(a.data != b.data);
    for (int64_t i = 0; i < a.numel(); ++i)
        BOOST_TEST(a.ptr<float>()[i] == 0.0f);
    a.ptr<float>()[11] = 1.0f;  // writable to its last element
    BOOST_TEST(a.ptr<float>()[11] == 1.0f);
}

BOOST_AUTO_TEST_SUITE_END()
