// The attention core on the GPU against ops::attention_core: a causal mask for queries that
// continue a cached prefix (query i sees keys 0 .. pos0 + i), one row masked entirely (zeros on
// both sides), different query/key and value widths.
#include <cmath>
#include <cstdint>

#include <boost/test/unit_test.hpp>

#include "cuda_test.h"
#include "hymoe/backend/cuda_gemm.h"
#include "hymoe/backend/ops_attention.h"
#include "hymoe/model/attention.h"

namespace utf = boost::unit_test;
using namespace hymoe;
using namespace hymoe::cuda_test;

BOOST_AUTO_TEST_SUITE(cuda_attention, *utf::label("cuda"))

BOOST_AUTO_TEST_CASE(masked_core_matches_the_cpu, *utf::precondition(need_gpu)) {
    Gpu g;
    cu::Blas blas(g.s, g.arena);
    const int64_t n_q = 13, pos0 = 50, n_k = pos0 + n_q, d_qk = 192, d_v = 128;
    const float tau = 1.0f / std::sqrt(static_cast<float>(d_qk));
    Buffer q = random({n_q, d_qk}, 120, DType::f32);
    Buffer k = random({n_k, d_qk}, 121, DType::f32);
    Buffer v = random({n_k, d_v}, 122, DType::f32);
    Buffer mask(DType::f32, {n_q, n_k});
    for (int64_t i = 0; i < n_q; ++i)
        for (int64_t u = 0; u < n_k; ++u)
            mask.ptr<float>()[i * n_k + u] = u <= pos0 + i && i != 4 ? 0.0f : -INFINITY;
    Buffer want(DType::f32, {n_q, d_v});
    ops::attention_core(q.view(), k.view(), v.view(), mask.view(), tau, want.view());
    Tensor dq = to_device(q.view(), DType::f32, g.arena, g.s);
    Tensor dk = to_device(k.view(), DType::f32, g.arena, g.s);
    Tensor dv = to_device(v.view(), DType::f32, g.arena, g.s);
    Tensor dmask = to_device(mask.view(), DType::f32, g.arena, g.s);
    Tensor scratch = g.arena.tensor(DType::f32, {n_q, n_k});
    Tensor dout = g.arena.tensor(DType::f32, {n_q, d_v});
    cu::attention_core(blas, dq, dk, dv, dmask, tau, scratch, dout);
    Buffer got = to_host(dout, g.s);
    const double err = rel_error(got.ptr<float>(), want.ptr<float>(), n_q * d_v);
    BOOST_TEST_INFO("normalised error " << err);
    BOOST_TEST(err < tolerance(DType::f32));
    for (int64_t y = 0; y < d_v; ++y)  // the fully masked query attends to nothing
        BOOST_TEST(got.ptr<float>()[4 * d_v + y] == 0.0f);
}

BOOST_AUTO_TEST_SUITE_END()
