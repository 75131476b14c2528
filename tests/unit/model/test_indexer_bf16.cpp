// Unit tests of the bf16 DSA indexer (ops::indexer_scores_bf16; the indexer of a bf16 KV cache):
// its scores against the fp32 indexer's within a derived bound, on both kernels (AVX-512-BF16
// where the CPU has it, portable); its top-k equal to the fp32 one wherever the score gaps exceed
// that bound; and a DSA layer over a bf16 pool still dense MLA when top-k covers every key, its
// sparse prefill equal to the masked expanded form otherwise.
//
// The bound. bf16 rounds to nearest with 8 significant bits: q̃ = q(1 + δ), k̃ = k(1 + ε),
// |δ|, |ε| ≤ u = 2⁻⁸, so |q̃·k̃ − q·k| ≤ (2u + u²)·A_j with A_j = Σ_i |q_j,i k_i|. The products of
// two bf16 are exact in fp32, and the d-term fp32 sum adds at most γ_d·(1 + u)²·A_j (γ_n =
// n·2⁻²⁴/(1 − n·2⁻²⁴)). ReLU is 1-Lipschitz, and the H-term weighted head sum adds γ_{H+1} of
// Σ_j |w_j|·|ReLU_j| ≤ Σ_j |w_j|·(1 + u)²(1 + γ_d)·A_j. So with A = Σ_j |w_j| A_j,
//   |bf16 − exact| ≤ A·[2u + u² + (1 + u)²(γ_d + γ_{H+1}(1 + γ_d))],
//   |fp32 − exact| ≤ A·[γ_d + γ_{H+1}(1 + γ_d)],
// and the two scores differ by at most the sum.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "hymoe/backend/ops.h"
#include "hymoe/backend/ops_attention.h"
#include "hymoe/core/rng.h"
#include "hymoe/model/attention.h"
#include "hymoe/model/kv_cache.h"
#include "hymoe/model/weights.h"

namespace {

using namespace hymoe;
using namespace hymoe::model;

double f64(float v) {
    return static_cast<double>(v);
}

double gamma_n(double n) {
    const double e = n * std::ldexp(1.0, -24);
    return e / (1.0 - e);
}

// Queries [n_q, H, d], head weights [n_q, H], keys [n_k, d]: keys k_s = m_s + N(0, 1) with m_s
// uniform in (−1, 1), queries 1/2 + N(0, 1), so that the scores spread by key (a top-k with
// clear gaps) and are not all of one sign.
struct Case {
    int64_t n_q, h, d, n_k;
    std::vector<float> q, w, k;
    Case(int64_t n_q_, int64_t h_, int64_t d_, int64_t n_k_, uint64_t seed)
        : n_q(n_q_), h(h_), d(d_), n_k(n_k_), q(n_q * h * d), w(n_q * h), k(n_k * d) {
        Philox rng(seed, 0, 0);
        rng.fill_normal(q.data(), q.size(), 0.5f, 1.0f);
        rng.fill_normal(w.data(), w.size(), 0.0f, 1.0f);
        rng.fill_normal(k.data(), k.size(), 0.0f, 1.0f);
        std::vector<float> m(static_cast<size_t>(n_k));
        rng.fill_normal(m.data(), m.size(), 0.0f, 1.0f);
        for (int64_t s = 0; s < n_k; ++s)
            for (int64_t e = 0; e < d; ++e)
                k[s * d + e] += std::tanh(m[s]);
    }
    Tensor view(std::vector<float>& v, Shape shape) const {
        return Tensor{v.data(), DType::f32, Device::cpu, std::move(shape)};
    }
    // fp32 indexer scores [n_q, n_k]
    std::vector<float> fp32() {
        std::vector<float> s(static_cast<size_t>(n_q * n_k));
        Tensor sv = view(s, {n_q, n_k});
        ops::indexer_scores(view(q, {n_q, h * d}), view(w, {n_q, h}), view(k, {n_k, d}), sv);
        return s;
    }
    // bf16 scores [n_q, n_k] over the first n_used keys (the rest left at `fill`)
    std::vector<float> bf16(int64_t n_used, float fill = 0.0f) const {
        ops::IndexerKeys keys(n_k, d);
        for (int64_t s = 0; s < n_k; ++s)
            keys.put(s, k.data() + s * d);
        std::vector<float> s(static_cast<size_t>(n_q * n_k), fill);
        ops::indexer_scores_bf16(q.data(), w.data(), n_q, h, keys, n_used, s.data(), n_k);
        return s;
    }
    // the bound on |bf16 − fp32| of score (t, s)
    double bound(int64_t t, int64_t s) const {
        double a = 0;
        for (int64_t j = 0; j < h; ++j) {
            double aj = 0;
            for (int64_t e = 0; e < d; ++e)
                aj += std::abs(f64(q[(t * h + j) * d + e]) * f64(k[s * d + e]));
            a += std::abs(static_cast<double>(w[t * h + j])) * aj;
        }
        const double u = std::ldexp(1.0, -8), gd = gamma_n(static_cast<double>(d));
        const double acc = gd + gamma_n(static_cast<double>(h + 1)) * (1 + gd);
        return a * (2 * u + u * u + (1 + u) * (1 + u) * acc + acc);
    }
};

// Runs `body` with the weight kernel (which also picks the indexer's) forced to k.
template <typename F>
void with_kernel(ops::WeightKernel k, F body) {
    ops::set_weight_kernel(k);
    body();
    ops::set_weight_kernel(ops::WeightKernel::automatic);
}

std::vector<ops::WeightKernel> kernels() {
    ops::set_weight_kernel(ops::WeightKernel::automatic);
    std::vector<ops::WeightKernel> all{ops::WeightKernel::portable};
    if (ops::weight_kernel() == ops::WeightKernel::avx512_bf16)
        all.push_back(ops::WeightKernel::avx512_bf16);
    else
        BOOST_TEST_MESSAGE("this CPU has no avx512_bf16: the portable kernel only");
    return all;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(indexer_bf16)

// Heads in groups of 8 and a remainder, odd and even d, key counts off the 16-key tile, one
// query and one key; the scores past n_used stay untouched.
BOOST_AUTO_TEST_CASE(scores_within_the_bf16_bound_of_fp32) {
    for (ops::WeightKernel kernel : kernels())
        with_kernel(kernel, [] {
            double worst = 0;
            int64_t rounded = 0, total = 0;
            for (auto [n_q, h, d, n_k] : {std::tuple{37, 12, 64, 53},
                                          std::tuple{5, 3, 7, 16},
                                          std::tuple{1, 16, 64, 1},
                                          std::tuple{20, 9, 30, 200}}) {
                Case c(n_q, h, d, n_k, static_cast<uint64_t>(n_q * 7 + d));
                const std::vector<float> x = c.fp32();
                const int64_t n_used = std::max<int64_t>(1, n_k - 3);
                const std::vector<float> y = c.bf16(n_used, 12345.0f);
                for (int64_t t = 0; t < n_q; ++t)
                    for (int64_t s = 0; s < n_k; ++s) {
                        const float yv = y[t * n_k + s], xv = x[t * n_k + s];
                        if (s >= n_used) {
                            BOOST_TEST(yv == 12345.0f);
                            continue;
                        }
                        worst = std::max(worst, std::abs(f64(yv) - f64(xv)) / c.bound(t, s));
                        rounded += yv != xv;
                        ++total;
                    }
            }
            BOOST_TEST_MESSAGE(ops::to_string(ops::weight_kernel())
                               << ": worst |bf16 − fp32| / bound " << worst << ", " << rounded
                               << " of " << total << " scores changed by the rounding");
            BOOST_TEST(worst <= 1.0);
            BOOST_TEST(rounded * 2 > total);  // the operands were rounded
        });
}

// Query i at position pos_first + i sees keys 0..pos_first + i. A key whose fp32 score minus the
// bound beats all but fewer than k other keys' score plus theirs must be in the bf16 top-k; a key
// whose score plus the bound is beaten by k others' minus theirs must not.
BOOST_AUTO_TEST_CASE(topk_equals_fp32_where_gaps_exceed_the_bound) {
    const int64_t n_q = 48, n_k = 300, top_k = 16, pos_first = n_k - n_q;
    Case c(n_q, 16, 64, n_k, 3);
    const std::vector<float> x = c.fp32(), y = c.bf16(n_k);
    std::vector<int64_t> keep(static_cast<size_t>(n_q * top_k)), n_keep(n_q);
    ops::indexer_select(c.view(const_cast<std::vector<float>&>(y), {n_q, n_k}),
                        pos_first,
                        top_k,
                        keep.data(),
                        n_keep.data());
    int64_t decided = 0, total = 0, wrong = 0;
    for (int64_t t = 0; t < n_q; ++t) {
        const int64_t visible = pos_first + t + 1;
        std::vector<double> lo(visible), hi(visible);
        for (int64_t s = 0; s < visible; ++s) {
            const double b = c.bound(t, s);
            lo[s] = f64(x[t * n_k + s]) - b;
            hi[s] = f64(x[t * n_k + s]) + b;
        }
        const auto kept = [&](int64_t s) {
            const int64_t* k0 = keep.data() + t * top_k;
            return std::binary_search(k0, k0 + n_keep[t], s);
        };
        for (int64_t s = 0; s < visible; ++s) {
            int64_t may_beat = 0, beat = 0;  // others that may beat s / surely beat s
            for (int64_t u = 0; u < visible; ++u)
                if (u != s) {
                    may_beat += hi[u] >= lo[s];
                    beat += lo[u] > hi[s];
                }
            const bool surely_in = may_beat < top_k, surely_out = beat >= top_k;
            decided += surely_in || surely_out;
            wrong += (surely_in && !kept(s)) || (surely_out && kept(s));
            ++total;
        }
    }
    BOOST_TEST_MESSAGE("bf16 top-" << top_k << ": " << decided << " of " << total
                                   << " keys decided by the bound, " << wrong << " wrong");
    BOOST_TEST(wrong == 0);
    BOOST_TEST(decided * 4 >= total * 3);  // the bound leaves most keys decided (79% here)
}

// The tiny preset's gated DSA layer over a bf16 pool: with top-k ≥ the sequence it is the same
// layer as dense MLA over a bf16 pool (the bf16 selection keeps every key); with top-k 8 the
// sparse prefill equals the masked expanded form (both select by the bf16 indexer) and differs
// from dense.
BOOST_AUTO_TEST_CASE(dsa_over_a_bf16_pool_is_dense_when_topk_covers_every_key) {
    ModelConfig cfg = preset_config("tiny");
    const int layer = 3;  // gated DSA
    LayerSpec spec = cfg.layers[layer];
    BOOST_REQUIRE(spec.mixer == Mixer::dsa);
    MlaWeights w;
    TensorList list = attention_tensors(cfg, spec, w);
    for (TensorSpec& t : list)
        t.std = 1.0f / std::sqrt(static_cast<float>(t.shape.back()));
    Philox rng(7, 0, 0);
    init_random(list, rng);
    const int64_t n = 40, d = cfg.hidden_size;
    Buffer x(DType::f32, {n, d});
    rng.fill_normal(x.ptr<float>(), static_cast<size_t>(n * d), 0.0f, 1.0f);
    // y of one prefill of n tokens over a fresh bf16 pool
    const auto run = [&](const LayerSpec& sp, AttnMode mode) {
        KvPool pool(cfg, whole_model(cfg), 4, 16, {}, DType::bf16);
        std::vector<int32_t> table;
        BOOST_REQUIRE(pool.reserve(table, n));
        AttnCache cache;
        cache.pool = &pool, cache.pages = &table, cache.layer = layer;
        Buffer y(DType::f32, {n, d});
        Tensor yv = y.view();
        attention_forward(
            backend::cpu_ctx(), cfg, sp, w, x.view(), single_sequence(n), {&cache}, yv, mode);
        return std::vector<float>(y.ptr<float>(), y.ptr<float>() + n * d);
    };
    const auto max_diff = [](const std::vector<float>& a, const std::vector<float>& b) {
        float e = 0;
        for (size_t i = 0; i < a.size(); ++i)
            e = std::max(e, std::abs(a[i] - b[i]));
        return e;
    };
    LayerSpec mla = spec;
    mla.mixer = Mixer::mla;
    const std::vector<float> dense = run(mla, AttnMode::automatic);
    cfg.indexer.top_k = static_cast<int>(n);
    BOOST_TEST(max_diff(run(spec, AttnMode::automatic), dense) <= 1e-6f);
    cfg.indexer.top_k = 8;
    const std::vector<float> sparse = run(spec, AttnMode::sparse);
    const std::vector<float> masked = run(spec, AttnMode::expanded);
    BOOST_TEST(max_diff(sparse, masked) <= 1e-5f);
    BOOST_TEST(max_diff(sparse, dense) > 1e-2f);
}

BOOST_AUTO_TEST_SUITE_END()
